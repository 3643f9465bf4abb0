"""Every Python device entry point end to end on the fake GPU backend, in
CPU-only CI: fastsafetensors_weights_iterator and instanttensor_weights_iterator
(progress bar on and off, one rank and rank 1 of a gloo group of 2),
load_file / safe_open(device="cuda"), pt_items_on_device and the PyTorch
iterators with a CUDA map location, and dummy weights filled on a device.

The seam (weightlift._gpu.test_seam_device): with WEIGHTLIFT_GPU_BACKEND=fake
and WEIGHTLIFT_TEST_TORCH_CUDA=N the package answers as if torch had CUDA
(current device N) and hands device tensors over as host copies, since
Debian's torch has no CUDA. Every tensor must equal the host load's, in the
reference's order. Without the fake backend the variable changes nothing."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

import weightlift
from weightlift import _core

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_fake_worker import rows  # noqa: E402

WORKER = HERE / "gpu_fake_worker.py"
FAKE = {"WEIGHTLIFT_GPU_BACKEND": "fake", "WEIGHTLIFT_FAKE_GPUS": "2", "WEIGHTLIFT_PINNED_RING": "4x64KiB"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("doors")
    files = []
    for i in (10, 2, 1):  # natural order: 1, 2, 10
        p = d / f"model-{i}.safetensors"
        weightlift.save_file({f"w{i}.a": torch.full((300, 40), float(i)), f"w{i}.b": torch.arange(5000) + i,
                              f"w{i}.h": (torch.arange(777, dtype=torch.float32) / (i + 1)).to(torch.bfloat16),
                              f"w{i}.empty": torch.zeros(0)}, p)
        files.append(str(p))
    pt = d / "pytorch_model.bin"
    torch.save({"x": torch.arange(6000, dtype=torch.float32), "y": torch.ones(3, 70, dtype=torch.float16)}, pt)
    return files, str(pt)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(tmp, spec, env_extra, world=1, timeout=180):
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1", **env_extra)
    if world == 1:
        r = subprocess.run([sys.executable, str(WORKER), str(spec_path), str(tmp / "out.json")], env=env,
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, r.stderr
        return [(json.load(open(tmp / "out.json")), r.stderr)]
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(spec_path), str(tmp / f"out{r}.json"), str(r),
                               str(world), str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    outs = []
    try:
        for r, p in enumerate(procs):
            _, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err}"
            outs.append((json.load(open(tmp / f"out{r}.json")), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def ok(result, key):
    v = result[key]
    assert not (isinstance(v, dict) and "error" in v), f"{key}: {v['error']}\n{v.get('trace', '')}"
    return v


def natural(files):
    return sorted(files, key=lambda f: int(pathlib.Path(f).stem.split("-")[1]))


def host_rows(files):
    """The host load (lazy, CPU) in the reference iterators' order: files in
    natural order, each file's tensors in offset order."""
    out = []
    for f in natural(files):
        with weightlift.safe_open(f, framework="pt") as s:
            out += rows((k, s.get_tensor(k)) for k in s.offset_keys())
    return out


def same_tensors(got, want):
    """Equal names, dtypes, shapes and bytes (the device column says where they came from)."""
    assert [r[:4] for r in got] == [r[:4] for r in want]


@pytest.mark.parametrize("current", [0, 1])
def test_every_device_door_on_one_rank(checkpoint, tmp_path, current):
    files, pt = checkpoint
    (res, err), = run_worker(tmp_path, {"files": files, "pt": pt, "device": f"cuda:{1 - current}"},
                             dict(FAKE, WEIGHTLIFT_TEST_TORCH_CUDA=str(current)))
    assert res["backend"] == "fake (host memory)" and res["seam"] == current
    want = host_rows(files)
    for bar in (False, True):  # use_tqdm_on_load=False was the defect: a disabled per-tensor bar
        same_tensors(ok(res, f"fastsafetensors/{bar}"), want)
        same_tensors(ok(res, f"instanttensor/{bar}"), want)
    assert "Loading safetensors using InstantTensor loader" in err  # the bar, when asked for
    assert "Loading fastsafetensors checkpoint shards" in err
    # load_file / safe_open to a device: safetensors' results (load_file in file order, keys() sorted
    # by name, as safetensors 0.8), the host's bytes.
    cpu = ok(res, "load_file/cpu")
    assert ok(res, "load_file") == [[r[:4] + ["cpu"] for r in f] for f in cpu]
    assert [[r[:4] for r in f] for f in ok(res, "safe_open.get_tensor")] == [sorted(r[:4] for r in f) for f in cpu]
    by_file = {tuple(sorted(r[0] for r in f)): f for f in cpu}
    for f in ok(res, "safe_open.get_tensors"):  # offset order
        assert sorted(r[:4] for r in f) == sorted(r[:4] for r in by_file[tuple(sorted(r[0] for r in f))])
    # PyTorch files with a CUDA map location: our reader into the device, torch.load's tensors.
    pt_cpu = ok(res, "pt/cpu")
    for key in ("pt_items_on_device", "pt_weights_iterator", "multi_thread_pt_weights_iterator"):
        assert sorted(r[:4] for r in ok(res, key)) == sorted(r[:4] for r in pt_cpu), key
    # Dummy weights: the engine's kernel (the fake's host fill) in device memory equals the CPU fill.
    assert ok(res, "dummy") == [["F16", True, True], ["BF16", True, True], ["F32", True, True]]
    costs = res["costs"]  # the first iterator's warm-up made the ring and the copier
    assert costs["warm_up"] and costs["ring_bytes"] == 4 * 64 * 1024, costs


def test_rank_1_of_a_gloo_group_gets_a_disabled_bar(checkpoint, tmp_path):
    files, pt = checkpoint
    outs = run_worker(tmp_path, {"files": files, "pt": pt}, dict(FAKE, WEIGHTLIFT_TEST_TORCH_CUDA="0"), world=2)
    want = host_rows(files)
    for rank, (res, err) in enumerate(outs):
        for bar in (False, True):
            same_tensors(ok(res, f"fastsafetensors/{bar}"), want)
            same_tensors(ok(res, f"instanttensor/{bar}"), want)
        shown = "Loading safetensors using InstantTensor loader" in err
        assert shown == (rank == 0), (rank, err[-2000:])


def test_the_seam_needs_the_fake_backend(checkpoint, tmp_path):
    if _core.gpu_device_count() > 0:
        pytest.skip("this machine has a GPU")
    files, pt = checkpoint
    env = {k: v for k, v in os.environ.items() if k != "WEIGHTLIFT_GPU_BACKEND"}
    env["WEIGHTLIFT_TEST_TORCH_CUDA"] = "0"
    code = ("import sys; from weightlift import _gpu; from weightlift.vllm_compat import "
            "fastsafetensors_weights_iterator as it\n"
            "assert _gpu.test_seam_device() is None\n"
            "try:\n    next(it(sys.argv[1:], False))\nexcept RuntimeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, *files], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "fastsafetensors_weights_iterator needs a CUDA device" in r.stdout
