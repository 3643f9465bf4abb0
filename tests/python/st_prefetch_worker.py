"""weightlift.safetensors on a CUDA device, end to end on the fake GPU backend
(run by test_st_prefetch.py in a process of its own: WEIGHTLIFT_GPU_BACKEND=fake,
WEIGHTLIFT_FAKE_GPUS=2, WEIGHTLIFT_TEST_TORCH_CUDA=0; see weightlift._gpu).

    python st_prefetch_worker.py DIR OUT.json [SCENARIO...]

Runs each scenario below (all of them without names) on files it writes in
DIR, and writes {scenario: "ok" | the failure with its traceback} to OUT.json.
The scenarios follow safetensors 0.9.0rc1's own CUDA tests of prefetch
(PrefetchCudaTests in its test_pread_backend.py, which need a real GPU) and
add what they cannot see: the device memory the fake accounts for (frees),
many loaders at once, the engine's pinned ring, safe_open's own CUDA reads.

Device tensors come back as host copies (the seam: Debian's torch has no
CUDA); where a scenario watches device memory it keeps the engine's device
arrays instead (_raw_loader), whose lifetimes are the tensors' on a GPU.
"""
import json
import os
import struct
import sys
import threading
import traceback

import torch

import weightlift.safetensors as st
from weightlift import _core
from weightlift.safetensors.torch import save_file

SOURCE = {
    "fp32_2d": torch.arange(12, dtype=torch.float32).reshape(3, 4).contiguous(),
    "bf16_2d": torch.arange(8, dtype=torch.bfloat16).reshape(2, 4).contiguous(),
    "fp16_3d": torch.arange(24, dtype=torch.float16).reshape(2, 3, 4).contiguous(),
    "i64_1d": torch.arange(7, dtype=torch.int64),
    "u8_1d": torch.arange(5, dtype=torch.uint8),
    "bool_1d": torch.tensor([True, False, True]),
    "scalar_fp32": torch.tensor(3.5, dtype=torch.float32),
    "empty_2d": torch.zeros((0, 4), dtype=torch.float32),
    "big": torch.arange(300_000, dtype=torch.float32).reshape(1000, 300),  # many ring slots of 64 KiB
}
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist()


def check_source(sd: dict, source=SOURCE) -> None:
    assert set(sd) == set(source), sorted(set(sd) ^ set(source))
    for k, want in source.items():
        assert same(sd[k], want), k


def raises(match: str, fn, *args, kind=st.SafetensorError, **kwargs):
    try:
        fn(*args, **kwargs)
    except kind as e:
        assert match in str(e), f"{type(e).__name__}: {e!r} does not say {match!r}"
        return str(e)
    raise AssertionError(f"no {kind.__name__} ({match})")


def write_raw(path: str, header: bytes, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        fh.write(data)
    return path


def device_used(device: int = 0) -> int:
    free, total = _core.gpu_memory_info(device)
    return total - free


def _raw_loader(f, plan=None, device="cuda:0"):
    """A loader whose tensors are the engine's device arrays themselves (no
    host copy): holding one holds device memory as a CUDA tensor would."""
    loader = f.prefetch(plan, device=device)
    loader._convert = lambda name, dtype, shape, data: data
    return loader


# ---- safetensors 0.9's own CUDA cases ----------------------------------------------------------

@scenario
def plan_rows_match_source(d):
    plan = {"fp32_2d": slice(1, 3), "i64_1d": slice(2, 5), "fp16_3d": None}
    with st.safe_open(PATH, framework="pt") as f, f.prefetch(plan, device="cuda:0") as loader:
        assert set(loader.names()) == set(plan) and len(loader) == 3
        assert same(loader.take("fp32_2d"), SOURCE["fp32_2d"][1:3])
        assert same(loader.take("i64_1d"), SOURCE["i64_1d"][2:5])
        raises("tensor bf16_2d is not in the prefetch plan", loader.take, "bf16_2d")
        streamed = dict(loader)
    assert set(streamed) == {"fp16_3d"} and same(streamed["fp16_3d"], SOURCE["fp16_3d"])


@scenario
def iteration_and_take_match_source(d):
    with st.safe_open(PATH, framework="pt") as f:
        with f.prefetch(device="cuda:0") as loader:
            check_source(dict(loader))
        with f.prefetch(device="cuda:0") as loader:
            check_source({k: loader.take(k) for k in loader.names()})
        with f.prefetch(device="cuda:0") as loader:  # the last tensor first: the others wait their turn
            last = loader.names()[-1]
            got = {last: loader.take(last)}
            got.update(loader)
            check_source(got)


@scenario
def names_len_and_repeated_iteration(d):
    with st.safe_open(PATH, framework="pt") as f, f.prefetch(device="cuda:0") as loader:
        assert loader.names() == f.offset_keys()  # file order
        assert len(loader) == len(SOURCE)
        first, second = dict(loader), dict(loader)
    assert set(first) == set(SOURCE) and second == {}


@scenario
def take_once_and_iteration_skips_taken(d):
    with st.safe_open(PATH, framework="pt") as f, f.prefetch(device="cuda:0") as loader:
        loader.take("fp32_2d")
        raises("fp32_2d: tensor already delivered (prefetch hands each tensor out once, via take or iteration)",
               loader.take, "fp32_2d")
        assert {n for n, _ in loader} == set(SOURCE) - {"fp32_2d"}


@scenario
def close_take_and_iteration_after(d):
    f = st.safe_open(PATH, framework="pt")
    loader = f.prefetch(device="cuda:0")
    loader.close()
    raises("fp32_2d: prefetch loader closed", loader.take, "fp32_2d")
    loader.close()  # twice is fine
    loader = f.prefetch(device="cuda:0")
    stream = iter(loader)
    next(stream)
    loader.close()
    raises("prefetch loader closed", list, stream)
    assert list(stream) == []  # raised once, then exhausted


@scenario
def closed_handle_and_outliving_loader(d):
    f = st.safe_open(PATH, framework="pt")
    f.__exit__(None, None, None)
    raises("File is closed", f.prefetch, device="cuda:0")
    with st.safe_open(PATH, framework="pt") as f:
        loader = f.prefetch(device="cuda:0")
    first = loader.take("fp32_2d")
    streamed = dict(loader)
    streamed["fp32_2d"] = first
    check_source(streamed)
    check_source(dict(st.safe_open(PATH, framework="pt").prefetch(device="cuda:0")))  # handle collected at once


@scenario
def two_loaders_from_one_handle_and_the_handle_unchanged(d):
    with st.safe_open(PATH, framework="pt") as f:
        with f.prefetch({"fp32_2d": None}, device="cuda:0") as first, \
                f.prefetch({"bf16_2d": None}, device="cuda:0") as second:
            assert same(first.take("fp32_2d"), SOURCE["fp32_2d"])
            assert same(second.take("bf16_2d"), SOURCE["bf16_2d"])
            assert same(f.get_slice("fp16_3d")[:1], SOURCE["fp16_3d"][:1])
            assert same(f.get_tensor("fp32_2d"), SOURCE["fp32_2d"])
            assert f.get_tensor_meta("fp32_2d").shape == [3, 4]
            assert set(f.get_tensors()) == set(SOURCE)


@scenario
def many_loaders_at_once_share_one_ring(d):
    """Eight loaders of one handle on two devices, taken from eight threads at
    once: every tensor right, and one pinned ring in the process."""
    errors, results = [], {}
    with st.safe_open(PATH, framework="pt") as f:
        loaders = [f.prefetch(device=f"cuda:{i % 2}", threads=1 + i % 3) for i in range(8)]

        def run(i):
            try:
                results[i] = dict(loaders[i])
            except Exception:
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        [loader.close() for loader in loaders]
    assert not errors, errors[0]
    for i in range(8):
        check_source(results[i])
    assert _core.gpu_process_costs()["ring_bytes"] == 4 * 64 * 1024  # WEIGHTLIFT_PINNED_RING=4x64KiB, once


@scenario
def plan_checks_like_safetensors(d):
    with st.safe_open(PATH, framework="pt") as f:
        raises("prefetch plan slice stop 10 for fp32_2d is out of range for 3 rows", f.prefetch,
               {"fp32_2d": slice(0, 10)}, device="cuda:0")
        raises("prefetch plan slice start -4 for fp32_2d is out of range for 3 rows", f.prefetch,
               {"fp32_2d": slice(-4, None)}, device="cuda:0")
        raises("invalid prefetch plan slice for fp32_2d: ValueError: slice step cannot be zero", f.prefetch,
               {"fp32_2d": slice(0, 3, 0)}, device="cuda:0")
        raises("prefetch plan slices must have step 1, got 2 for fp32_2d", f.prefetch,
               {"fp32_2d": slice(0, 3, 2)}, device="cuda:0")
        raises("prefetch plan selects no tensors", f.prefetch, {}, device="cuda:0")
        raises("File does not contain tensor nope", f.prefetch, {"nope": None}, device="cuda:0")
        raises("cannot slice rows of the 0-d tensor scalar_fp32", f.prefetch, {"scalar_fp32": slice(0, 1)},
               device="cuda:0")
        raises("prefetch plan values must be None or a slice, got <class 'int'> for fp32_2d", f.prefetch,
               {"fp32_2d": 3}, device="cuda:0")
        raises("prefetch plan keys must be tensor names", f.prefetch, {1: None}, device="cuda:0")
        raises("prefetch plan slice bounds for fp32_2d must be integers or None", f.prefetch,
               {"fp32_2d": slice(0.5, 2)}, device="cuda:0")
        raises("argument 'plan'", f.prefetch, [("fp32_2d", None)], device="cuda:0", kind=TypeError)
        raises("prefetch loads to cuda devices, not cpu", f.prefetch)
        raises("prefetch loads to cuda devices, not mps", f.prefetch, device="mps")
        raises("can't convert negative int", f.prefetch, device="cuda:0", threads=-1, kind=OverflowError)
        with f.prefetch({"fp32_2d": slice(-3, 3), "big": slice(-2, None), "empty_2d": slice(0, 0),
                         "i64_1d": slice(5, 2)}, device="cuda:0") as loader:
            assert same(loader.take("fp32_2d"), SOURCE["fp32_2d"])
            assert same(loader.take("big"), SOURCE["big"][-2:])
            assert tuple(loader.take("empty_2d").shape) == (0, 4)
            assert tuple(loader.take("i64_1d").shape) == (0,)
    with st.safe_open(PATH, framework="np") as f:
        raises('prefetch is only compatible with framework="pt"', f.prefetch)


@scenario
def plan_empty_rows_and_threads(d):
    with st.safe_open(PATH, framework="pt") as f:
        with f.prefetch({"fp32_2d": slice(2, 2)}, device="cuda:0") as loader:
            t = loader.take("fp32_2d")
        assert tuple(t.shape) == (0, 4) and t.dtype == torch.float32
        for threads in (0, 2, 10_000):  # clamped to what the engine takes
            with f.prefetch(device="cuda:0", threads=threads) as loader:
                check_source(dict(loader))


@scenario
def int_device_and_handle_device(d):
    with st.safe_open(PATH, framework="pt", device=0) as f, f.prefetch() as loader:
        check_source(dict(loader))
    with st.safe_open(PATH, framework="pt", device="cuda:1", backend="pread") as f:
        with f.prefetch() as loader:
            check_source(dict(loader))
        raises("prefetch loads to cuda devices, not cpu", f.prefetch, device="cpu")
    with st.safe_open(PATH, framework="pt") as f, f.prefetch(device=1) as loader:
        check_source(dict(loader))


@scenario
def dtypes_torch_lacks(d):
    f6 = write_raw(os.path.join(d, "f6.safetensors"), b'{"x":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}',
                   bytes(3))
    with st.safe_open(f6, framework="pt", device="cuda:0", backend="pread") as f:
        raises("prefetch cannot hand out dtype F6_E2M3: torch has no matching dtype", f.prefetch)
    fnuz = write_raw(os.path.join(d, "fnuz.safetensors"),
                     b'{"x":{"dtype":"F8_E5M2FNUZ","shape":[4],"data_offsets":[0,4]}}', bytes([1, 2, 3, 4]))
    if hasattr(torch, "float8_e5m2fnuz"):
        with st.safe_open(fnuz, framework="pt") as f, f.prefetch(device="cuda:0") as loader:
            x = loader.take("x")
        assert x.dtype == torch.float8_e5m2fnuz and x.view(torch.uint8).tolist() == [1, 2, 3, 4]
    else:  # this torch (Debian's 1.13) has no float8: refused up front, or its bytes with raw_dtypes
        with st.safe_open(fnuz, framework="pt") as f:
            raises("prefetch cannot hand out dtype F8_E5M2FNUZ", f.prefetch, device="cuda:0")
        with st.safe_open(fnuz, framework="pt", raw_dtypes=True) as f, f.prefetch(device="cuda:0") as loader:
            assert loader.take("x").view(-1).tolist() == [1, 2, 3, 4]


@scenario
def misaligned_offsets(d):
    path = write_raw(os.path.join(d, "misaligned.safetensors"),
                     b'{"u8":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},'
                     b'"f32":{"dtype":"F32","shape":[4],"data_offsets":[3,19]}}',
                     bytes([1, 2, 3]) + struct.pack("<4f", 0.0, 1.0, 2.0, 3.0))
    with st.safe_open(path, framework="pt") as f, f.prefetch(device="cuda:0") as loader:
        assert torch.equal(loader.take("f32"), torch.arange(4, dtype=torch.float32))
        assert torch.equal(loader.take("u8"), torch.tensor([1, 2, 3], dtype=torch.uint8))


# ---- what the fake sees: device memory -----------------------------------------------------------

@scenario
def frees(d):
    """An allocation lives while the loader holds a tensor not taken, or any
    tensor handed out lives; no longer. Exactly the planned bytes are taken
    (a plan's gap and unplanned rows are not allocated)."""
    big = SOURCE["big"].numel() * 4
    base = device_used()
    with st.safe_open(PATH, framework="pt") as f:
        # every tensor taken and dropped, the loader still open: freed
        loader = _raw_loader(f)
        got = dict(loader)
        assert device_used() > base + big
        del got
        assert device_used() == base, (device_used(), base)
        loader.close()
        # the same by take(), never iterating to the end
        loader = _raw_loader(f)
        got = [loader.take(n) for n in loader.names()]
        del got
        assert device_used() == base, (device_used(), base)
        loader.close()
        # tensors not taken, the loader open: held until close
        loader = _raw_loader(f)
        one = loader.take("fp32_2d")
        assert device_used() > base + big
        del one
        assert device_used() > base + big
        loader.close()
        assert device_used() == base
        # close with tensors taken and kept: they keep the memory until they go
        loader = _raw_loader(f, {"big": slice(10, 20), "i64_1d": None})
        kept = loader.take("big")
        used = device_used() - base
        assert 10 * 300 * 4 <= used < 10 * 300 * 4 + 4096, used  # the planned rows, not the tensor
        loader.close()
        assert device_used() - base == used
        del kept
        assert device_used() == base
        # the handle's own CUDA reads let go of theirs as well
        with st.safe_open(PATH, framework="pt", device="cuda:0") as g:
            g.get_tensors()
            g.get_tensor("big")
            g.get_slice("big")[3:5]
        assert device_used() == base


@scenario
def safe_open_cuda_reads_are_the_device_path(d):
    """get_tensor / get_tensors / get_slice of a "cuda" handle: through the
    engine's ring into device memory, equal to the host's reads."""
    for backend in ("mmap", "pread"):
        with st.safe_open(PATH, framework="pt", device="cuda:1", backend=backend) as f, \
                st.safe_open(PATH, framework="pt") as host:
            check_source({k: f.get_tensor(k) for k in f.keys()})
            check_source(f.get_tensors())
            assert list(f.get_tensors()) == f.offset_keys()
            for index in (slice(2, 7), slice(None), 3, -1, (slice(1, 4), slice(10, 20)), (slice(None), 5),
                          (Ellipsis, 2), (slice(990, None),), slice(-5, None)):
                want = host.get_slice("big")[index]
                got = f.get_slice("big")[index]
                assert same(got, want.contiguous()), (backend, index)
            assert same(f.get_slice("fp16_3d")[1:, :, 2], host.get_slice("fp16_3d")[1:, :, 2].contiguous())
            if backend == "pread":  # safetensors' indexer and its words, before any device work
                raises("Error during slicing [0:2000] with shape [1000, 300]", f.get_slice("big").__getitem__,
                       slice(0, 2000))
            raises("File does not contain tensor nope", f.get_tensor, "nope")
            raises("File does not contain tensor nope", f.get_slice, "nope")


def main():
    global PATH
    d, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(SCENARIOS)
    PATH = os.path.join(d, "tiny.safetensors")
    save_file(SOURCE, PATH, metadata={"foo": "bar"})
    result = {"backend": _core.gpu_backend_name()}
    for name in names:
        try:
            SCENARIOS[name](d)
            result[name] = "ok"
        except Exception:
            result[name] = traceback.format_exc()
    json.dump(result, open(out, "w"))


PATH = ""

if __name__ == "__main__":
    main()
