"""load_into with CUDA destinations (what the vLLM plug-in does with CUDA
parameters): the engine reads each tensor through its pinned staging ring
and copies it into memory the caller holds on the device. No GPU here: run
on the fake backend (WEIGHTLIFT_GPU_BACKEND=fake, host memory standing in for
device memory, so host tensors can play the caller's device tensors), and
without it the call fails before reading, naming what is missing."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file


def _write(folder, seed):
    folder.mkdir()
    g = torch.Generator().manual_seed(seed)
    save_file({"a": torch.randn(300, 70, generator=g).to(torch.bfloat16),
               "b": torch.randint(0, 1 << 40, (1000,), generator=g)}, folder / "model-00001-of-00002.safetensors")
    save_file({"c": torch.randn(4097, generator=g), "d.w": torch.randn(64, 64, generator=g)},
              folder / "model-00002-of-00002.safetensors")
    return sorted(str(p) for p in folder.glob("*.safetensors"))


@pytest.fixture()
def shards(tmp_path):
    return _write(tmp_path / "model", 5)


@pytest.fixture()
def other(tmp_path):
    return _write(tmp_path / "other", 6)


def _run(code, env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=120)


CODE = """
    import ctypes
    import torch
    from safetensors.torch import load_file
    from weightlift import _core
    from weightlift._engine import open_stream, options
    from weightlift._tensors import TORCH_TO_NAME

    def data_ptr(capsule):  # DLManagedTensor -> DLTensor {{void* data; DLDevice {{int32 type, id}}; ...}}
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        p = get(capsule, b"dltensor")
        dev = (ctypes.c_int32 * 2).from_address(p + ctypes.sizeof(ctypes.c_void_p))
        assert (dev[0], dev[1]) == (2, 1), tuple(dev)  # kDLCUDA, cuda:1
        return ctypes.c_void_p.from_address(p).value

    files, other = {files!r}, {other!r}
    want = {{}}
    for f in files:
        want.update(load_file(f))
    nbytes = {{n: t.numel() * t.element_size() for n, t in want.items()}}
    raw = lambda t: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
    # Device memory of the fake backend, playing vLLM's CUDA parameters: the engine's own device
    # load of another checkpoint of the same shapes allocates it (and leaves other bytes in it).
    held = {{n: d for n, _, _, _, d in open_stream(other, max_queued_bytes=1 << 30, strategy="stream",
                                                 device="cuda:1", gds="off")}}
    ptr = {{n: data_ptr(d) for n, d in held.items()}}
    before = {{n: _core.device_bytes(ptr[n], nbytes[n], "cuda:1") for n in ptr}}
    assert all(before[n] != raw(want[n]) for n in ptr)
    items = [(n, ptr[n], nbytes[n], TORCH_TO_NAME[t.dtype], list(t.shape)) for n, t in want.items() if n != "b"]
    stats = _core.load_into(files, options(strategy="stream", device="cuda:1", block_size=1 << 16), items)
    for n, t in want.items():
        got = _core.device_bytes(ptr[n], nbytes[n], "cuda:1")
        assert got == (before[n] if n == "b" else raw(t)), n  # b was not asked for
    assert stats["tensors"] == 3, stats
    # With shard rules: rank 1's half of 'a' (dim 1) into the first half of a device buffer.
    _core.load_into(files, options(strategy="stream", device="cuda:1", shard_rules=["a:1"], tp_rank=1, tp_size=2),
                    [("a", ptr["a"], nbytes["a"] // 2, "BF16", [300, 35])])
    assert _core.device_bytes(ptr["a"], nbytes["a"] // 2, "cuda:1") == raw(want["a"][:, 35:])
    half = nbytes["a"] // 2
    assert _core.device_bytes(ptr["a"] + half, half, "cuda:1") == raw(want["a"])[half:]
    print("ok", _core.gpu_backend_name())
"""


def test_load_into_cuda_targets_on_the_fake_backend(shards, other):
    env = {"WEIGHTLIFT_GPU_BACKEND": "fake", "WEIGHTLIFT_FAKE_GPUS": "2", "WEIGHTLIFT_PINNED_RING": "4x64KiB"}
    r = _run(CODE.format(files=shards, other=other), env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok fake (host memory)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_load_into_cuda_targets_without_a_gpu_fails_before_reading(shards):
    code = f"""
        from weightlift import _core
        from weightlift._engine import options
        try:
            _core.load_into({shards!r}, options(device="cuda:0"), [("a", 1 << 40, 42000, "BF16", [300, 70])])
        except Exception as e:
            print(type(e).__name__, e)
    """
    r = _run(code, {"WEIGHTLIFT_GPU_BACKEND": ""})
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert out and not out.startswith("ok") and ("CUDA" in out or "cuda" in out or "GPU" in out), out
