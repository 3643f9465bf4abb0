"""map_params (the vLLM plug-in): a placement that is a whole host parameter
whose bytes lie contiguously in the file becomes a zero-copy view of the
file's pages instead of a copy. On the toy model of test_vllm_direct (vLLM's
loaders without vLLM), at TP 1 and on each rank of TP 2: the parameters end
byte-identical to the model's own load, exactly the mappable placements were
mapped (whole tensors, dim-0 shards; not stacked parts, not a padded
vocabulary, not dim-1 shards), the model's own copy confirms them, a loader
that writes the parameter (the transposing one) writes this process's copy
and never the file."""
from __future__ import annotations

import hashlib

import pytest
import torch

from test_vllm_direct import Toy, _checkpoint, _plain, _state
from weightlift import _core
from weightlift._engine import iterate, open_stream
from weightlift._engine import options as engine_options
from weightlift._tensors import TORCH_DTYPES, TORCH_TO_NAME, to_torch
from weightlift.vllm_plugin import _direct


def _sha(files):
    return [hashlib.sha256(open(f, "rb").read()).hexdigest() for f in files]


@pytest.mark.parametrize("tp_size", [1, 2])
def test_mapped_parameters_equal_the_models_own_load(tmp_path, tp_size):
    files, _ = _checkpoint(tmp_path)
    before = _sha(files)
    for rank in range(tp_size):
        ref = Toy(rank, tp_size)
        ref.load_weights(_plain(files))
        ours = Toy(rank, tp_size)
        listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
        plan = _direct.make_plan(ours, listed, rank, tp_size)
        storage = {n: p.data_ptr() for n, p in ours.named_parameters(remove_duplicate=False)}
        want = [n for n, pl in plan.placements.items() if _direct.mappable(pl)]
        mapped = set()
        params = dict(ours.named_parameters(remove_duplicate=False))
        for name, t in iterate(files, only=want, file_views=True, strategy="lazy", ordered=False):
            if _direct.map_into(params, plan.placements[name], t):
                mapped.add(name)
        expect = {"model.layers.0.conv.weight", "model.layers.0.bias"}
        # TP 1: o_proj whole (the vocabulary is padded: embed and lm_head fill only the first rows);
        # TP 2: the vocabulary's dim-0 shards (o_proj is split along dim 1).
        expect |= ({"model.layers.0.self_attn.o_proj.weight"} if tp_size == 1
                   else {"model.embed_tokens.weight", "lm_head.weight"})
        assert mapped == expect, (rank, mapped)
        for n in mapped:
            pl = plan.placements[n]
            assert dict(ours.named_parameters(remove_duplicate=False))[pl.param_name].data_ptr() \
                != storage[pl.param_name]
        _load_rest(ours, files, listed, plan, mapped, rank, tp_size)
        a, b = _state(ref), _state(ours)
        for n in a:
            assert torch.equal(a[n].view(torch.int16) if a[n].dtype == torch.bfloat16 else a[n],
                               b[n].view(torch.int16) if b[n].dtype == torch.bfloat16 else b[n]), (n, rank)
        loose, clashing = _direct.check_placements(plan, plan.mat)
        assert not loose and not clashing
        # Confirmed by the model's own copy, except the transposing loader's, which wrote this
        # process's copy-on-write pages.
        assert {n for n in mapped if not plan.placements[n].confirmed} == {"model.layers.0.conv.weight"}
    assert _sha(files) == before  # no write ever reached the file


def _load_rest(model, files, listed, plan, mapped, rank, tp_size):
    """The placements not mapped through the engine's copy, then the model's
    own load_weights over stand-ins (as the plug-in does); plan.mat is set."""
    rest = {n: pl for n, pl in plan.placements.items() if n not in mapped}
    items = [(n, pl.region.data_ptr(), pl.nbytes, TORCH_TO_NAME[pl.dtype], list(pl.shard_shape))
             for n, pl in rest.items()]
    rules = plan.shard_rules(rest)
    opts = dict(tp_rank=rank, tp_size=tp_size) if tp_size > 1 else {}
    _core.load_into(files, engine_options(strategy="stream", shard_rules=rules or None, **opts), items)
    file_of = {n: f for f in files for n, _, _ in _core.list_tensors([f])}

    def read(name):
        return next(to_torch(d, s, b, n, fl) for n, fl, d, s, b in
                    open_stream([file_of[name]], max_queued_bytes=1 << 30, only=[name], strategy="lazy"))

    mat = plan.mat = _direct.Materializer(read)

    def weights():
        for n, pl in plan.placements.items():
            yield n, _direct.PlannedTensor(pl, mat)
        others = [n for n, _, _ in listed if n not in plan.placements]
        rules2 = plan.shard_rules(others)
        for name, file, dtype, shape, data in open_stream(files, max_queued_bytes=1 << 30, ordered=True,
                                                          only=others, strategy="lazy",
                                                          shard_rules=rules2 or None, **opts):
            t = to_torch(dtype, shape, data, name, file)
            if name in plan.sharded:
                full = next(s for n, _, s in listed if n == name)
                t = _direct.sharded_standin(name, t.dtype, full, plan.sharded[name], t, mat)
            yield name, t

    model.load_weights(weights())


def test_map_into_refuses_what_does_not_fit(tmp_path):
    files, t = _checkpoint(tmp_path)
    model = Toy()
    listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
    plan = _direct.make_plan(model, listed)
    pl = plan.placements["model.layers.0.self_attn.o_proj.weight"]
    ptr = model.o.data_ptr()
    params = dict(model.named_parameters(remove_duplicate=False))
    assert not _direct.map_into(params, pl, t["model.layers.0.self_attn.o_proj.weight"].float())  # dtype
    assert not _direct.map_into(params, pl, t["model.layers.0.self_attn.o_proj.weight"].t())  # not contiguous
    assert model.o.data_ptr() == ptr
    # Stacked parts and a padded vocabulary are never mappable.
    assert not _direct.mappable(plan.placements["model.layers.0.self_attn.q_proj.weight"])
    assert not _direct.mappable(plan.placements["model.embed_tokens.weight"])


def _big_checkpoint(tmp_path, views=True):
    """Two 1 MiB tensors (many pages each) and, with `views`, what map_params
    maps of them: [(name, file, address, nbytes)] over the file's pages (the
    engine's views, kept in `keep`)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    t = {"a.weight": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
         "b.weight": torch.randn(1024, 512, generator=g).to(torch.bfloat16)}
    f = str(tmp_path / "model.safetensors")
    save_file(t, f)
    if not views:
        return f, t, {}, []
    keep = dict(iterate([f], file_views=True, strategy="lazy", ordered=False))  # as _map_params_impl maps
    return f, t, keep, [(n, f, v.data_ptr(), v.numel() * v.element_size()) for n, v in keep.items()]


def _resident_pages(addr, n):
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    a, b = addr // page * page, (addr + n + page - 1) // page * page
    vec = (ctypes.c_ubyte * ((b - a) // page))()
    assert libc.mincore(a, b - a, vec) == 0
    return sum(v & 1 for v in vec), len(vec)


def test_mapped_parameters_are_read_in_before_the_load_returns(tmp_path):
    import ctypes
    import mmap
    import os

    from weightlift.vllm_plugin import _read_ahead

    f, t, _, _ = _big_checkpoint(tmp_path, views=False)
    # The file mapped copy-on-write with no page mapped in yet (the engine's views map theirs in as
    # they are handed over), then its pages dropped from the page cache: a cold mapped parameter.
    fd = os.open(f, os.O_RDONLY)
    header = 8 + int.from_bytes(os.pread(fd, 8, 0), "little")  # (a fault on the mapping would read around it)
    m = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.fdatasync(fd)  # (dirty pages stay)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    mapped = [("a.weight", f, base + header, 1 << 20), ("b.weight", f, base + header + (1 << 20), 1 << 20)]
    missing = sum(p - r for r, p in (_resident_pages(a, n) for _, _, a, n in mapped))
    assert missing > 0, "the page cache kept the file: nothing to test"
    got = _read_ahead.make_resident(mapped, threads=2)
    assert got["bytes"] == 2 << 20
    assert got["bytes_not_resident"] == min(missing * 4096, got["bytes"])
    for _, _, a, n in mapped:
        r, p = _resident_pages(a, n)
        assert r == p
    assert _read_ahead.make_resident(mapped)["bytes_not_resident"] == 0
    view = torch.frombuffer(m, dtype=torch.int16, count=(2 << 20) // 2, offset=header)
    assert torch.equal(view, torch.cat([t["a.weight"].view(torch.int16).reshape(-1),
                                        t["b.weight"].view(torch.int16).reshape(-1)]))  # the file's bytes


def test_a_checkpoint_truncated_under_its_mapped_parameters_fails_the_load_naming_them(tmp_path):
    from weightlift.vllm_plugin import _read_ahead

    f, _, keep, mapped = _big_checkpoint(tmp_path)
    with open(f, "r+b") as fh:  # modified in place under the mapping: cut after the first tensor's first page
        fh.truncate(8192)
    with pytest.raises(RuntimeError, match="cannot be read into memory") as e:
        _read_ahead.make_resident(mapped)
    assert f in str(e.value) and any(f"parameter {n}," in str(e.value) for n, *_ in mapped)
    keep.clear()  # (never touched again: their pages are gone)


def test_late_residency_reads_in_on_its_thread_holding_the_mappings(tmp_path):
    """_read_ahead.LateResidency (inside load_model: the mapped pages read
    while vLLM post-processes): the same reads as make_resident, on a thread;
    the mapped tensors are held until they are in (a parameter the
    post-processing drops must not take its mapping away under the thread),
    then let go; wait() gives the figures."""
    import gc
    import weakref

    from weightlift.vllm_plugin import _read_ahead

    f, t, keep, mapped = _big_checkpoint(tmp_path)
    views = list(keep.values())
    kept, dropped = views[0], weakref.ref(views[1])
    late = _read_ahead.LateResidency(mapped, views, threads=2, cpus="inherit")
    del views, keep  # the second: what post-processing does to a repacked parameter
    got = late.wait()
    assert got["late"] and got["bytes"] == 2 << 20 and got["waited_seconds"] >= 0
    _, _, a, n = mapped[0]
    r, p = _resident_pages(a, n)
    assert r == p and kept.data_ptr() == a
    gc.collect()
    assert dropped() is None  # let go once read in


def test_late_residency_hands_a_truncated_checkpoint_to_the_waiter(tmp_path):
    from weightlift.vllm_plugin import _read_ahead

    f, _, keep, mapped = _big_checkpoint(tmp_path)
    with open(f, "r+b") as fh:
        fh.truncate(8192)
    late = _read_ahead.LateResidency(mapped, list(keep.values()), threads=2, cpus="inherit")
    with pytest.raises(RuntimeError, match="cannot be read into memory") as e:
        late.wait()
    assert f in str(e.value) and any(f"parameter {n}," in str(e.value) for n, *_ in mapped)
    keep.clear()


@pytest.mark.parametrize("option,types,on", [
    ("auto", {"/m": "ext4"}, True),
    ("auto", {"/m": "xfs", "/n": "tmpfs"}, True),
    ("auto", {"/m": "overlay"}, True),
    ("auto", {"/m": "nfs4"}, False),
    ("auto", {"/m": "ext4", "/n": "lustre"}, False),
    ("auto", {"/m": "fuse.s3fs"}, False),
    ("auto", {"/m": "cifs"}, False),
    ("auto", {"/m": "virtiofs"}, False),
    ("auto", {"/m": "9p"}, False),
    ("auto", {"/m": ""}, False),  # the mount table does not tell
    (True, {"/m": "nfs4"}, True),
    (False, {"/m": "ext4"}, False),
])
def test_map_params_by_default_only_where_the_checkpoint_is_on_a_local_filesystem(option, types, on):
    from weightlift.vllm_plugin._options import map_params_on

    got, why = map_params_on(option, types)
    assert got is on
    if option == "auto" and not on:
        assert "not a local filesystem" in why and "copied" in why
        bad = [t for t in types.values() if t not in ("ext4", "xfs", "tmpfs")]
        assert (bad[0] or "an unknown filesystem") in why


def test_map_params_option_values():
    from weightlift.vllm_plugin._options import Options

    assert Options.parse({})[0].map_params == "auto"
    assert Options.parse({"map_params": True})[0].map_params is True
    assert Options.parse({"map_params": False})[0].map_params is False
    with pytest.raises(ValueError, match="map_params must be true, false or 'auto', got 'yes'"):
        Options.parse({"map_params": "yes"})
