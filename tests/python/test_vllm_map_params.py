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
