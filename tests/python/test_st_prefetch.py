"""weightlift.safetensors' CUDA side (safetensors 0.9's prefetch ->
PrefetchLoader, and safe_open's own CUDA reads) end to end on the fake GPU
backend, in CPU-only CI: each scenario of st_prefetch_worker.py, run in one
process of its own (the fake and the test seam must be chosen before the
backend is first used). safetensors 0.9.0rc1's own CUDA tests need a real GPU
and are skipped here; the scenarios carry their cases over, and add the
device memory the fake accounts for, many loaders at once, and the ring.

Without the fake, the errors prefetch raises before any device work are
checked here, and by safetensors 0.9's own suite (tests/python/safetensors_suite)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import weightlift.safetensors as st
from weightlift import _core

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import st_prefetch_worker  # noqa: E402

FAKE = {"WEIGHTLIFT_GPU_BACKEND": "fake", "WEIGHTLIFT_FAKE_GPUS": "2", "WEIGHTLIFT_PINNED_RING": "4x64KiB",
        "WEIGHTLIFT_TEST_TORCH_CUDA": "0"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("st_prefetch")
    out = d / "out.json"
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1", **FAKE)
    r = subprocess.run([sys.executable, str(HERE / "st_prefetch_worker.py"), str(d), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "fake (host memory)", res["backend"]
    return res


@pytest.mark.parametrize("name", list(st_prefetch_worker.SCENARIOS))
def test_on_the_fake_gpu(results, name):
    assert results[name] == "ok", results[name]


def test_without_a_gpu_prefetch_says_why_after_checking_the_plan(tmp_path):
    if _core.gpu_device_count() > 0:
        pytest.skip("this machine has a GPU")
    p = str(tmp_path / "m.safetensors")
    from weightlift.safetensors.torch import save_file

    save_file({"a": torch.zeros(4, 2)}, p)
    with st.safe_open(p, framework="pt", device="cuda:0") as f:
        with pytest.raises(st.SafetensorError, match="prefetch plan slices must have step 1, got 2 for a"):
            f.prefetch({"a": slice(0, 4, 2)})
        with pytest.raises(st.SafetensorError, match="needs a CUDA device"):
            f.prefetch({"a": slice(0, 2)})
        with pytest.raises(RuntimeError, match=r"safe_open\(device=...\) needs a CUDA device"):
            f.get_tensor("a")  # as every device door says it


def test_tensor_meta_is_the_header(tmp_path):
    p = str(tmp_path / "m.safetensors")
    from weightlift.safetensors.torch import save_file

    save_file({"b": torch.zeros(3, 5, dtype=torch.float16), "a": torch.ones(2, dtype=torch.int64)}, p)
    for backend in ("mmap", "pread"):
        with st.safe_open(p, framework="pt", backend=backend) as f:
            a, b = f.get_tensor_meta("a"), f.get_tensor_meta("b")
            assert (a.dtype, a.shape, a.data_offsets) == ("I64", [2], (0, 16))
            assert (b.dtype, b.shape, b.data_offsets) == ("F16", [3, 5], (16, 46))
            assert repr(b) == 'TensorMeta { dtype: "F16", shape: [3, 5], data_offsets: (16, 46) }'
            with pytest.raises(AttributeError):
                b.dtype = "F32"
            with pytest.raises(AttributeError):
                b.data_offsets = (0, 1)
            b.shape.append(7)  # a copy each time, as safetensors'
            assert b.shape == [3, 5]
            with pytest.raises(st.SafetensorError, match="File does not contain tensor nope"):
                f.get_tensor_meta("nope")
    with pytest.raises(TypeError):
        st.TensorMeta()
    with pytest.raises(TypeError):
        st.PrefetchLoader()
    f = st.safe_open(p, framework="np")
    f.__exit__(None, None, None)
    with pytest.raises(st.SafetensorError, match="File is closed"):
        f.get_tensor_meta("a")
