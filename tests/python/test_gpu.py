"""The GPU face without a GPU: the reference iterators' clear errors, their
device choice, file order and GDS-fallback rule, and the engine's device
options (on the fake backend, in a subprocess). Device copies themselves are
tested in C++ on the fake backend (tests/gpu_device_test.cpp)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import weightlift
from weightlift import _core, _distributed, _engine, _gpu
from weightlift.vllm_compat import fastsafetensors_weights_iterator, instanttensor_weights_iterator

NO_GPU = _core.gpu_device_count() == 0 or not torch.cuda.is_available()


@pytest.fixture()
def shards(tmp_path):
    files = []
    for i in (10, 2, 1):  # natural order: 1, 2, 10
        p = tmp_path / f"model-{i}.safetensors"
        weightlift.save_file({f"w{i}.a": torch.full((3, 4), float(i)), f"w{i}.b": torch.arange(5) + i}, p)
        files.append(str(p))
    return files


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_without_a_gpu_the_iterators_name_what_is_missing(shards):
    why = _gpu.cuda_unavailable_reason()
    assert why
    if torch.version.cuda is None:
        assert f"this torch ({torch.__version__}) is a CPU-only build" in why
    assert "weightlift: " + _core.gpu_unavailable_reason() in why
    with pytest.raises(RuntimeError, match="fastsafetensors_weights_iterator needs a CUDA device: "):
        next(fastsafetensors_weights_iterator(shards, False))
    with pytest.raises(ValueError, match="InstantTensor loading requires an NVIDIA GPU: "):
        next(instanttensor_weights_iterator(shards, False))
    with weightlift.safe_open(shards[0], framework="pt", device="cuda:0") as f:
        with pytest.raises(RuntimeError, match=r"safe_open\(device=...\) needs a CUDA device"):
            f.get_tensor("w10.a")
    with pytest.raises(RuntimeError, match="pt_load_map_location needs a CUDA device"):
        _gpu.pt_items_on_device(shards[0], {"cuda:1": "cuda:0"})
    # The engine itself refuses a device it cannot use, naming why.
    with pytest.raises(Exception, match=_core.gpu_unavailable_reason().split(":")[0]):
        _engine.open_stream(shards, max_queued_bytes=1 << 30, strategy="stream", device="cuda:0")


def test_bad_device_options_are_value_errors(shards):
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        _engine.options(device="gpu0")
    with pytest.raises(ValueError, match="gds must be auto, on or off, not 'maybe'"):
        _engine.options(gds="maybe")
    with pytest.raises(ValueError, match="unknown device"):
        _gpu._device_name("tpu", "x")


def test_map_locations_that_name_one_cuda_device():
    assert _gpu._single_cuda_target("cuda:1") == "cuda:1"
    assert _gpu._single_cuda_target(torch.device("cuda", 2)) == "cuda:2"
    assert _gpu._single_cuda_target(0) == "cuda:0"
    assert _gpu._single_cuda_target({"cuda:1": "cuda:0", "cuda:2": "cuda:0"}) == "cuda:0"
    assert _gpu._single_cuda_target({"cuda:1": "cuda:0", "cuda:2": "cpu"}) is None
    assert _gpu._single_cuda_target("cpu") is None
    assert _gpu.pt_items_on_device("unused.bin", "cpu") is None  # torch.load's business


class Calls:
    """A stand-in for the device stream: records each load, yields or fails."""

    def __init__(self, plan):
        self.plan, self.calls = list(plan), []

    def __call__(self, files, device, gds, pg, desc, use_tqdm_on_load, per_tensor_bar=False, **kw):
        self.calls.append({"files": files, "device": device, "gds": gds, "pg": pg, **kw})
        step = self.plan.pop(0)
        for item in step:
            if isinstance(item, Exception):
                raise item
            yield item


@pytest.fixture()
def fake_cuda(monkeypatch):
    monkeypatch.setattr(_gpu, "cuda_unavailable_reason", lambda: "")
    monkeypatch.setattr(_gpu, "current_cuda_device", lambda what="": "cuda:3")


def test_fastsafetensors_device_order_and_gds_fallback_before_the_first_yield(shards, monkeypatch, fake_cuda):
    calls = Calls([[RuntimeError("x.safetensors: gds=on: GPUDirect Storage cannot be used: ...")],
                   [("a", 1), ("b", 2)]])
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    assert list(fastsafetensors_weights_iterator(shards, False)) == [("a", 1), ("b", 2)]
    assert [c["gds"] for c in calls.calls] == ["auto", "off"]
    assert calls.calls[0]["device"] == "cuda:3"  # torch's current device
    assert [os.path.basename(f) for f in calls.calls[0]["files"]] == [
        "model-1.safetensors", "model-2.safetensors", "model-10.safetensors"]


def test_fastsafetensors_gds_error_after_the_first_yield_propagates(shards, monkeypatch, fake_cuda):
    calls = Calls([[("a", 1), OSError("x.safetensors: gds: cuFileRead of 4096 bytes at offset 0 failed")],
                   [("a", 1), ("b", 2)]])
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    it = fastsafetensors_weights_iterator(shards, False)
    assert next(it) == ("a", 1)
    with pytest.raises(OSError, match="cuFileRead"):
        next(it)
    assert len(calls.calls) == 1  # no second load: earlier tensors would come twice


def test_fastsafetensors_other_errors_and_nogds_propagate(shards, monkeypatch, fake_cuda):
    calls = Calls([[RuntimeError("x.safetensors: corrupt header")]])
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    with pytest.raises(RuntimeError, match="corrupt header"):
        list(fastsafetensors_weights_iterator(shards, False))
    # Several ranks: no GDS from the start (as the reference), so nothing to fall back to.
    calls = Calls([[RuntimeError("gds: something")]])
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    monkeypatch.setattr(_gpu, "_group_size", lambda pg: 2)
    with pytest.raises(RuntimeError, match="gds: something"):
        list(fastsafetensors_weights_iterator(shards, False))
    assert [c["gds"] for c in calls.calls] == ["off"]


def test_instanttensor_device_order_and_group(shards, monkeypatch, fake_cuda):
    calls = Calls([[("w1.a", 0)]])
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    assert list(instanttensor_weights_iterator(shards, False)) == [("w1.a", 0)]
    c = calls.calls[0]
    assert c["device"] == "cuda:3" and c["pg"] is None and c["gds"] == "auto"
    assert os.path.basename(c["files"][-1]) == "model-10.safetensors"


def test_instanttensor_engram_tables_on_the_host_and_local_experts(tmp_path, monkeypatch, fake_cuda):
    """vLLM 0.34: load_engram_on_cpu keeps Engram tables out of the device load and
    yields them afterwards from host memory; local_expert_ids goes to the engine; either
    makes the ranks' tensor sets differ, so the world group stays out."""
    p = tmp_path / "model.safetensors"
    names = ["model.engram.embed.weight", "model.layers.0.mlp.experts.1.w1.weight",
             "ple.ple_embedding.ngram_embedding.shard_3.weight", "model.norm.weight"]
    weightlift.save_file({n: torch.full((2,), float(i)) for i, n in enumerate(names)}, p)
    calls = Calls([[("model.norm.weight", "on-device")]] * 3)
    monkeypatch.setattr(_gpu, "_device_stream", calls)
    monkeypatch.setattr(_gpu, "_world_group", lambda: "world")
    monkeypatch.setattr(_gpu, "_group_size", lambda pg: 2)
    got = list(instanttensor_weights_iterator([str(p)], False, load_engram_on_cpu=True))
    assert got[0] == ("model.norm.weight", "on-device")
    host = dict(got[1:])
    assert sorted(host) == sorted([names[0], names[2]])
    assert torch.equal(host[names[0]], torch.full((2,), 0.0)) and host[names[2]].device.type == "cpu"
    assert sorted(calls.calls[0]["exclude"]) == sorted([names[0], names[2]]) and calls.calls[0]["pg"] is None
    list(instanttensor_weights_iterator([str(p)], False, {1}))
    assert calls.calls[1]["local_expert_ids"] == {1} and calls.calls[1]["pg"] is None
    list(instanttensor_weights_iterator([str(p)], False))  # neither: the group goes to the engine
    assert calls.calls[2]["pg"] == "world" and calls.calls[2]["exclude"] is None


def test_instanttensor_tables_only_need_no_gpu(tmp_path, monkeypatch):
    """vLLM 0.34: a source of Engram tables only, kept on the host, opens no
    device load, so it needs no GPU (here: none, no fake either)."""
    p = tmp_path / "engram.safetensors"
    weightlift.save_file({"layers.1.engram.embed.weight": torch.arange(4.0).reshape(2, 2)}, p)
    monkeypatch.setattr(_gpu, "_device_stream", lambda *a, **k: pytest.fail("a device load was started"))
    got = dict(instanttensor_weights_iterator([str(p)], False, load_engram_on_cpu=True))
    assert list(got) == ["layers.1.engram.embed.weight"]
    assert torch.equal(got["layers.1.engram.embed.weight"], torch.arange(4.0).reshape(2, 2))
    if not _gpu.cuda_unavailable_reason():
        return  # a real GPU here: the device load below would run
    with pytest.raises(ValueError, match="InstantTensor loading requires an NVIDIA GPU"):
        list(instanttensor_weights_iterator([str(p)], False))  # the table to the device: a GPU needed


def test_a_process_group_goes_to_the_engine(shards, monkeypatch):
    assert _gpu._collective_options(None) == {}
    pg, made = object(), []
    monkeypatch.setattr(_gpu, "_group_size", lambda g: 2)
    monkeypatch.setattr(_distributed, "collective_for_group", lambda g: made.append(g) or "collective-of-pg")
    # A group of more than one rank becomes the engine's collective (its distributed loading).
    assert _gpu._collective_options(pg) == {"collective": "collective-of-pg"}
    assert made == [pg]
    monkeypatch.setattr(_gpu, "_group_size", lambda g: 1)
    assert _gpu._collective_options(pg) == {}


def test_the_engine_device_path_on_the_fake_backend(shards):
    # The fake backend stands host memory in for device memory: pinned loads
    # come back as host arrays equal to a host load; CUDA loads as kDLCUDA
    # arrays of the right device (torch here cannot hold them).
    code = textwrap.dedent(f"""
        import ctypes
        from torch.utils import dlpack
        from weightlift import _core, _engine

        def device_of(capsule):  # DLManagedTensor -> DLTensor {{void* data; DLDevice {{int32 type, id}}}}
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            p = get(capsule, b"dltensor")
            dev = (ctypes.c_int32 * 2).from_address(p + ctypes.sizeof(ctypes.c_void_p))
            return dev[0], dev[1]

        files = _core.natural_sort({shards!r})
        def load(engine, strategy="stream"):
            stream = _engine.open_stream(files, max_queued_bytes=1 << 30, strategy=strategy, **engine)
            return [(n, d) for n, _, _, _, d in stream]
        lazy = load({{}}, "lazy")  # file order, then offset order
        host = {{n: dlpack.from_dlpack(d).numpy().tobytes() for n, d in lazy}}
        pinned = load({{"device": "pinned", "ordered": True}})
        assert all(device_of(d) == (1, 0) for _, d in pinned)  # pinned memory is host memory (kDLCPU)
        assert {{n: dlpack.from_dlpack(d).numpy().tobytes() for n, d in pinned}} == host
        out = load({{"device": "cuda:1", "ordered": True, "gds": "off"}})
        assert [n for n, _ in out] == [n for n, _ in lazy], [n for n, _ in out]
        assert [n for n, _ in out][:2] == ["w1.b", "w1.a"]  # model-1 first; int64 stored before float32
        assert all(device_of(d) == (2, 1) for _, d in out), [device_of(d) for _, d in out]
        print("ok", _core.gpu_backend_name())
    """)
    env = dict(os.environ, WEIGHTLIFT_GPU_BACKEND="fake", WEIGHTLIFT_FAKE_GPUS="2", WEIGHTLIFT_PINNED_RING="4x64KiB")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok fake (host memory)"


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_pt_iterators_send_a_cuda_map_location_to_our_reader(tmp_path):
    from weightlift.vllm_compat import multi_thread_pt_weights_iterator, pt_weights_iterator

    p = tmp_path / "pytorch_model.bin"
    torch.save({"a": torch.arange(6, dtype=torch.float32)}, p)
    # Our reader takes a single CUDA target (and says what is missing here); torch.load never runs.
    for it in (pt_weights_iterator, multi_thread_pt_weights_iterator):
        for loc in ("cuda:0", {"cuda:1": "cuda:0"}):
            with pytest.raises(RuntimeError, match="pt_load_map_location needs a CUDA device"):
                list(it([str(p)], False, loc))
    # A map location that is not one CUDA device is torch.load's (here: to the CPU).
    assert [(n, t.tolist()) for n, t in pt_weights_iterator([str(p)], False, {"cpu": "cpu", "cuda:0": "cpu"})] \
        == [("a", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])]
