"""The read-ahead of a local checkpoint (weightlift._engine.read_ahead, the
engine's ReadAhead): what it plans and reads, that a cached checkpoint is
left alone, that a load after it gets the same bytes, the expert filter, and
that a load into device memory (the fake GPU backend) still gets its bytes
only in the load (host reads ahead, device copies later)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file


def _write(d, seed):
    g = torch.Generator().manual_seed(seed)
    d.mkdir()
    save_file({"model.layers.0.mlp.experts.0.up_proj.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
               "model.layers.0.mlp.experts.1.up_proj.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
               "norm.weight": torch.randn(64, generator=g)}, d / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": torch.randn(512, 64, generator=g).to(torch.bfloat16)},
              d / "model-00002-of-00002.safetensors")
    return sorted(str(p) for p in d.glob("*.safetensors"))


@pytest.fixture()
def shards(tmp_path):
    return _write(tmp_path / "m", 3)


def _nbytes(t):
    return t.numel() * t.element_size()


def test_plans_every_tensor_byte_and_the_load_after_it_gets_the_same_bytes(shards):
    from weightlift._engine import iterate, read_ahead

    job = read_ahead(shards)
    assert job.wait() == ""
    p = job.progress()
    want = {}
    for f in shards:
        want.update(load_file(f))
    assert p["planned"] and p["done"] and not p["remote"]
    assert p["bytes_planned"] == sum(_nbytes(t) for t in want.values())
    assert p["bytes_read"] + p["bytes_cached"] == p["bytes_planned"]
    got = dict(iterate(shards, read_ahead=job))  # local: the option changes nothing but is accepted
    assert got.keys() == want.keys()
    for n, t in want.items():
        assert torch.equal(got[n], t), n
    # Read again: everything cached now, nothing to read.
    again = read_ahead(shards)
    assert again.wait() == ""
    assert again.progress()["bytes_cached"] == p["bytes_planned"]


def test_other_ranks_experts_are_not_planned(shards):
    from weightlift._engine import read_ahead

    job = read_ahead(shards, local_expert_ids=[0])
    assert job.wait() == ""
    assert job.progress()["bytes_planned"] == 256 * 64 * 2 + 64 * 4 + 512 * 64 * 2


def test_only_the_named_tensors_are_planned(shards):
    from weightlift._engine import read_ahead

    job = read_ahead(shards, only=["lm_head.weight", "norm.weight"])
    assert job.wait() == ""
    assert job.progress()["bytes_planned"] == 512 * 64 * 2 + 64 * 4
    nothing = read_ahead(shards, only=[])
    assert nothing.wait() == "" and nothing.progress()["bytes_planned"] == 0


def test_the_tensors_named_first_change_the_order_not_the_bytes(shards):
    from weightlift._engine import read_ahead

    whole = read_ahead(shards)
    assert whole.wait() == ""
    job = read_ahead(shards, first=["lm_head.weight"], threads=1)
    assert job.wait() == ""
    assert job.progress()["bytes_planned"] == whole.progress()["bytes_planned"]
    assert job.progress()["bytes_capped"] == 0


def test_bad_input_is_reported(tmp_path, shards):
    from weightlift._engine import read_ahead

    with pytest.raises(ValueError, match="rank 3 is outside"):
        read_ahead(shards, rank=3, world_size=2)
    with pytest.raises(ValueError, match="no files"):
        read_ahead([])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    job = read_ahead([str(bad)])
    why = job.wait()
    assert str(bad) in why, why
    assert job.progress()["done"] and job.progress()["bytes_read"] == 0


def test_device_loads_copy_only_in_the_load_on_the_fake_backend(shards, tmp_path):
    other = _write(tmp_path / "other", 4)  # same names and shapes, other bytes
    """Host reads while the model is built, device copies once its parameters exist."""
    code = f"""
        import ctypes, torch
        from safetensors.torch import load_file
        from weightlift import _core
        from weightlift._engine import open_stream, options, read_ahead
        from weightlift._tensors import TORCH_TO_NAME

        def data_ptr(capsule):
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            return ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value

        files, other = {shards!r}, {other!r}
        want = {{}}
        for f in files:
            want.update(load_file(f))
        raw = lambda t: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
        job = read_ahead(files)
        assert job.wait() == ""
        # "Parameters" in device memory, allocated after the read-ahead (as vLLM's construction does),
        # holding other bytes.
        held = {{n: d for n, _, _, _, d in open_stream(other, max_queued_bytes=1 << 30, strategy="stream",
                                                     device="cuda:0", gds="off")}}
        ptr = {{n: data_ptr(d) for n, d in held.items()}}
        assert all(_core.device_bytes(ptr[n], t.numel() * t.element_size(), "cuda:0") != raw(t)
                   for n, t in want.items())
        items = [(n, ptr[n], t.numel() * t.element_size(), TORCH_TO_NAME[t.dtype], list(t.shape))
                 for n, t in want.items()]
        _core.load_into(files, options(strategy="stream", device="cuda:0", read_ahead=job), items)
        for n, t in want.items():
            assert _core.device_bytes(ptr[n], t.numel() * t.element_size(), "cuda:0") == raw(t), n
        print("ok")
    """
    env = dict(os.environ, WEIGHTLIFT_GPU_BACKEND="fake", WEIGHTLIFT_FAKE_GPUS="1", WEIGHTLIFT_PINNED_RING="4x64KiB")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
