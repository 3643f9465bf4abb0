"""vLLM 0.33/0.34's weight_utils changes that vLLM 0.34's own tests do not
cover, as cases of vLLM 0.34's behaviour (written from its sources): each
case runs against weightlift.vllm_compat and, where vLLM 0.34 is importable
(scripts/test's vLLM 0.34 step), against vLLM's own weight_utils in the same
run, so the expectations are 0.34's and not only ours. vLLM's own tests
(attention sinks, EPLB expert ids, dummy fp8/e8m0/packed values, finalize
hooks, drop_checkpoint_cache on a folder, get_quant_config's online
quantization, ...) run against vllm_compat in the same step:
tests/vllm034/suite/run.py."""
from __future__ import annotations

import inspect
import os
import random
import types

import pytest
import torch
from safetensors.torch import save_file


def _vllm_034() -> bool:
    try:
        import vllm
        from packaging.version import Version

        return Version(vllm.__version__).release[:2] >= (0, 34)
    except Exception:
        return False


IMPLS = ["weightlift"] + (["vllm"] if _vllm_034() else [])


class Impl:
    """One implementation and its seams (vLLM's tests patch its module's globals)."""

    def __init__(self, which: str, monkeypatch):
        self.which, self.mp = which, monkeypatch
        if which == "vllm":
            from vllm.model_executor.model_loader import weight_utils
        else:
            from weightlift import vllm_compat as weight_utils
        self.mod = weight_utils

    def set_rank(self, rank: int) -> None:
        self.mp.setattr(self.mod, "get_world_group", lambda: types.SimpleNamespace(rank=rank))


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    return Impl(request.param, monkeypatch)


def _shuffled(impl, files, rank):
    want = sorted(files, key=impl.mod._natural_sort_key)
    random.Random(rank).shuffle(want)
    return want


# ---- shuffle_safetensors_files (0.34) ------------------------------------------------------------------------


def test_shuffle_files_is_a_rank_seeded_permutation_of_the_natural_order(impl):
    files = [f"/m/model-{i:05d}-of-00012.safetensors" for i in (3, 1, 12, 2, 10, 11, 4, 5, 6, 7, 8, 9)]
    orders = []
    for rank in (0, 1, 5):
        impl.set_rank(rank)
        got = impl.mod._shuffle_files(files)
        assert got == _shuffled(impl, files, rank)
        assert impl.mod._shuffle_files(list(reversed(files))) == got  # the input order does not matter
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3


def _one_tensor_files(tmp_path, n=6):
    files = []
    for i in range(n):
        p = tmp_path / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({f"t{i + 1}": torch.full((3,), float(i))}, str(p))
        files.append(str(p))
    return files


def test_the_safetensors_iterators_read_in_the_shuffled_order(impl, tmp_path):
    files = _one_tensor_files(tmp_path)
    impl.set_rank(2)
    want = [f"t{int(os.path.basename(f)[6:11])}" for f in _shuffled(impl, files, 2)]
    assert want != sorted(want)
    it = impl.mod.safetensors_weights_iterator(files, False, shuffle_safetensors_files=True)
    assert [n for n, _ in it] == want
    with pytest.raises(TypeError):  # keyword only
        impl.mod.safetensors_weights_iterator(files, False, None, None, True)
    # The multi-thread iterator: its fourth positional parameter (tensors come as the threads
    # finish them, so the order is _shuffle_files' call, not the output's).
    assert list(inspect.signature(impl.mod.multi_thread_safetensors_weights_iterator).parameters)[:4] == [
        "hf_weights_files", "use_tqdm_on_load", "max_workers", "shuffle_safetensors_files"]
    calls = []
    real = impl.mod._shuffle_files
    impl.mp.setattr(impl.mod, "_shuffle_files", lambda fs: calls.append(list(fs)) or real(fs))
    assert sorted(n for n, _ in impl.mod.multi_thread_safetensors_weights_iterator(files, False, 2, True)) == \
        sorted(want)
    assert calls == [files]
    assert sorted(n for n, _ in impl.mod.multi_thread_safetensors_weights_iterator(files, False, 2)) == sorted(want)
    assert calls == [files]  # not without the flag


# ---- get_available_memory replaces _get_available_ram_bytes (0.34) -----------------------------------------


@pytest.mark.parametrize(("fs_type", "strategy", "ram_multiplier", "should_prefetch"), [
    ("nfs", None, 2, True), ("lustre", None, 2, True), ("nfs", None, 1, False), ("nfs", "lazy", 2, False),
    ("ext4", None, 2, False)])
def test_auto_prefetch_asks_get_available_memory(impl, tmp_path, fs_type, strategy, ram_multiplier,
                                                 should_prefetch):
    checkpoint = tmp_path / "model.safetensors"
    save_file({"weight": torch.ones(2)}, str(checkpoint))
    impl.mp.setattr(impl.mod, "_get_fs_type", lambda _: fs_type)
    impl.mp.setattr(impl.mod, "get_available_memory", lambda: checkpoint.stat().st_size * ram_multiplier)
    calls = []
    impl.mp.setattr(impl.mod, "_prefetch_all_checkpoints", lambda *a, **k: calls.append((a, k)))
    weights = dict(impl.mod.safetensors_weights_iterator([str(checkpoint)], use_tqdm_on_load=False,
                                                         safetensors_load_strategy=strategy))
    assert torch.equal(weights["weight"], torch.ones(2))
    assert bool(calls) is should_prefetch


def test_get_available_memory_is_the_hosts_or_less():
    psutil = pytest.importorskip("psutil")
    from weightlift import vllm_compat

    got = vllm_compat.get_available_memory()
    assert 0 < got <= psutil.virtual_memory().total


# ---- initialize_single_dummy_weight (0.34: by dtype, name=, low/high None) ---------------------------------


def _random_bytes(n, seed, dtype=torch.uint8):
    g = torch.Generator().manual_seed(seed)
    t = torch.empty(n, dtype=dtype)
    return t.random_(-128, 128, generator=g) if dtype == torch.int8 else t.random_(0, 256, generator=g)


def test_dummy_values_by_dtype(impl):
    fill = impl.mod.initialize_single_dummy_weight
    assert [(p.name, p.default) for p in inspect.signature(fill).parameters.values()] == [
        ("param", inspect.Parameter.empty), ("low", None), ("high", None), ("seed", 1234), ("name", "")]
    if hasattr(torch, "float8_e8m0fnu"):  # torch >= 2.7
        e8m0 = torch.empty(16, dtype=torch.float8_e8m0fnu)
        fill(e8m0)
        assert (e8m0.view(torch.uint8) == 120).all()
    scale = torch.zeros(16, dtype=torch.uint8)
    fill(scale, name="model.layers.0.mlp.experts.w13_weight_scale")
    assert (scale == 120).all()
    packed = torch.zeros(4096, dtype=torch.uint8)
    fill(packed, seed=3, name="model.layers.0.mlp.experts.w13_weight")
    assert torch.equal(packed, _random_bytes(4096, 3))
    i8 = torch.zeros(4096, dtype=torch.int8)
    fill(i8, seed=5)
    assert torch.equal(i8, _random_bytes(4096, 5, torch.int8))
    if hasattr(torch, "float4_e2m1fn_x2"):  # torch >= 2.8
        fp4 = torch.zeros(64, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        fill(fp4, seed=7)
        assert torch.equal(fp4.view(torch.uint8), _random_bytes(64, 7))
    ids = torch.full((8,), 5, dtype=torch.int32)
    fill(ids)
    assert (ids == 5).all()  # other integers untouched
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1
        fp8 = torch.empty(4096, dtype=torch.float8_e4m3fn)
        fill(fp8)
        v = fp8.float()
        assert v.abs().max() <= 1.0 and v.abs().max() > 0.5  # +-1 for 8-bit floats, not +-1e-3
    bf16 = torch.empty(4096, dtype=torch.bfloat16)
    fill(bf16)
    assert 0 < bf16.float().abs().max() <= 1e-3
    fill(bf16, low=0.5, high=1.0, seed=3)
    assert (bf16 >= 0.5).all() and (bf16 <= 1.0).all()
    fixed = torch.empty(4)
    fixed.dummy_weight_value = 0.25
    fill(fixed)
    assert (fixed == 0.25).all()
    fill(torch.empty(3, device="meta"))  # left alone


# ---- finalize_model_weights (0.34) -----------------------------------------------------------------------------


class _Hooked(torch.nn.Module):
    def __init__(self, name, log, *children):
        super().__init__()
        self._name, self._log = name, log
        for i, c in enumerate(children):
            self.add_module(f"c{i}", c)

    def process_weights_after_loading(self):
        self._log.append(self._name)


def _quant_method(log):
    try:
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    except ImportError:
        QuantizeMethodBase = object

    class Method(QuantizeMethodBase):
        def create_weights(self, *a, **k):
            pass

        def apply(self, *a, **k):
            pass

        def process_weights_after_loading(self, layer):
            log.append("method")

    return Method()


def test_finalize_model_weights_runs_each_hook_once_children_first(impl):
    # vLLM's test_finalize_runs_every_module_hook_after_its_submodules covers vLLM's path;
    # here also weightlift's without vLLM installed (its own quant-method and attention tests).
    log = []
    shared = _Hooked("shared", log)
    inner = _Hooked("inner", log)
    quantized = _Hooked("quantized", log, inner)
    quantized.quant_method = _quant_method(log)
    root = _Hooked("root", log, _Hooked("a", log, shared, _Hooked("c", log)), _Hooked("b", log, shared), quantized)
    root.plain = torch.nn.Linear(2, 2)  # no hook
    impl.mod.finalize_model_weights(root)
    # A shared module once, before all its parents; a quantized module's own hook, not its
    # submodules' nor its method's (the method processes them in the loader's pass).
    assert log == ["shared", "c", "a", "b", "quantized", "root"]


# ---- copy_weight_ (0.34) and the loaders that use it -------------------------------------------------------------


def test_copy_weight_copies_and_returns_the_destination(impl):
    dst, src = torch.zeros(4, 3), torch.arange(12.0).reshape(4, 3)
    assert impl.mod.copy_weight_(dst, src) is dst and torch.equal(dst, src)
    one = torch.zeros(1)
    impl.mod.copy_weight_(one, torch.tensor([2.0]))
    assert one.item() == 2.0
    p = torch.nn.Parameter(torch.zeros(2, 2), requires_grad=False)
    impl.mod.default_weight_loader(p, torch.ones(2, 2))
    assert (p == 1).all()
    scalar = torch.nn.Parameter(torch.zeros(()), requires_grad=False)
    impl.mod.default_weight_loader(scalar, torch.tensor([3.0]))
    assert scalar.item() == 3.0


# ---- drop_checkpoint_cache (0.34: every snapshot of the cache, Linux only) ------------------------------------


def test_drop_checkpoint_cache_finds_snapshots_without_refs(impl, tmp_path, monkeypatch):
    snaps = tmp_path / "models--org--m" / "snapshots"
    files = []
    for commit in ("abc123", "def456"):
        (snaps / commit).mkdir(parents=True)
        f = snaps / commit / "model.safetensors"
        f.write_bytes(b"x" * 100)
        files.append(f)
    released = []

    def fadvise(fd, offset, length, advice):
        assert (offset, length, advice) == (0, 0, os.POSIX_FADV_DONTNEED)
        released.append(os.fstat(fd).st_ino)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # A cache seeded at a pinned commit has no refs/main: every snapshot it holds.
    impl.mod.drop_checkpoint_cache("org/m", cache_dir=str(tmp_path))
    assert sorted(released) == sorted(f.stat().st_ino for f in files)
    released.clear()
    impl.mod.drop_checkpoint_cache(str(snaps / "abc123"))  # a local folder
    assert released == [files[0].stat().st_ino]
    released.clear()
    impl.mod.drop_checkpoint_cache("org/absent", cache_dir=str(tmp_path))  # nothing found: logged only
    assert released == []
