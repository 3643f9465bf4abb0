"""WeightliftModelLoader at its seam with vLLM, without an engine start
(seconds): the installed vLLM's DefaultModelLoader machinery around a toy
model whose load_weights copies each tensor into the parameter of its name.

  * the model's first load_weights writes straight into parameters; every
    later caller of get_all_weights (a fresh loader, as reload_weights and
    EPLB build one; a second load_weights of the same model) gets plain
    tensors and changes only what it keeps;
  * EPLB's expert set (vLLM 0.34's compute_eplb_local_expert_ids, which the
    loader's _init_ep_weight_filter sets as local_expert_ids) is what the
    model receives, other experts unread;
  * LoadConfig.shuffle_safetensors_files (0.34) orders the files as vLLM's
    _shuffle_files does;
  * tensors the model's weights_transforms touch are left to the model.
Run in the vLLM 0.32 venv (scripts/test's tests/vllm) and the 0.34 one."""
from __future__ import annotations

import random
import types

import pytest
import torch
from safetensors.torch import save_file

from weightlift.vllm_compat import _natural_sort_key
from weightlift.vllm_plugin._loader import WeightliftModelLoader

E, H = 8, 16


def _eplb_ids(num_experts, redundant, ep_size, ep_rank):
    try:  # vLLM 0.34's own
        from vllm.model_executor.model_loader.ep_weight_filter import compute_eplb_local_expert_ids
    except ImportError:
        from weightlift.vllm_compat import compute_eplb_local_expert_ids
    return compute_eplb_local_expert_ids(num_experts, redundant, ep_size, ep_rank)


def _checkpoint(folder, files=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    names = ["model.embed.weight", "model.layers.0.self_attn.o_proj.weight", "model.norm.weight"]
    names += [f"model.layers.0.mlp.experts.{i}.gate_proj.{k}" for i in range(E) for k in ("weight", "weight_scale")]
    tensors = {}
    for n in names:
        shape = (1,) if n.endswith("scale") else ((H,) if "norm" in n else (H, H))
        dtype = torch.float32 if n.endswith(("scale", "norm.weight")) else torch.bfloat16
        tensors[n] = torch.randn(shape, generator=g).to(dtype)
    per = (len(names) + files - 1) // files
    paths = []
    for i in range(files):
        part = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
        path = folder / f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        save_file(part, str(path))
        paths.append(str(path))
    return tensors, paths


class Toy(torch.nn.Module):
    """Parameters named as the checkpoint (a module tree from dotted names);
    load_weights copies each tensor through its mapper, if any, into the
    parameter of its name, recording what it received."""

    def __init__(self, shapes: dict[str, tuple[tuple, torch.dtype]], mapper=None):
        super().__init__()
        if mapper is not None:
            self.hf_to_vllm_mapper = mapper
        for name, (shape, dtype) in shapes.items():
            *path, leaf = name.split(".")
            m = self
            for p in path:
                if not hasattr(m, p):
                    m.add_module(p, torch.nn.Module())
                m = getattr(m, p)
            m.register_parameter(leaf, torch.nn.Parameter(torch.full(shape, -7, dtype=dtype), requires_grad=False))
        self.received: list[tuple[str, type]] = []

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        if getattr(self, "hf_to_vllm_mapper", None) is not None:
            weights = self.hf_to_vllm_mapper.apply(weights)
        for name, t in weights:
            self.received.append((name, type(t)))
            params[name].data.copy_(t)
        return {n for n, _ in self.received}


def _config(folder):
    return types.SimpleNamespace(model=str(folder), revision=None, model_weights="", quantization=None,
                                 multimodal_config=None)


def _loader(shuffle=False, **extra):
    from vllm.config.load import LoadConfig

    kw = {"shuffle_safetensors_files": True} if shuffle else {}
    loader = WeightliftModelLoader(LoadConfig(load_format="weightlift", model_loader_extra_config=extra, **kw))
    loader._init_ep_weight_filter = lambda *a: None  # no EP (it reads the current vLLM config)
    return loader


def _toy_for(tensors, keep=lambda n: True, mapper=None):
    return Toy({n: (tuple(t.shape), t.dtype) for n, t in tensors.items() if keep(n)}, mapper)


def test_only_the_first_load_writes_into_parameters(tmp_path):
    tensors, _ = _checkpoint(tmp_path)
    model = _toy_for(tensors)
    loader = _loader()
    loader.load_weights(model, _config(tmp_path))
    s = loader.last_stats
    assert s["placements"] == s["confirmed"] > 0 and s["loose"] == 0
    from weightlift.vllm_plugin._direct import PlannedTensor

    assert any(issubclass(t, PlannedTensor) for _, t in model.received)
    for n, p in model.named_parameters():
        assert torch.equal(p.data, tensors[n]), n

    # What post-processing does to a serving model: parameters rewritten in place.
    o_proj = model.get_parameter("model.layers.0.self_attn.o_proj.weight")
    o_proj.data.mul_(2)
    processed = o_proj.data.clone()
    # EPLB's redistribution: a fresh loader, a caller that keeps one expert's tensors.
    other = _loader()
    kept = []
    for name, t in other.get_all_weights(_config(tmp_path), model):
        assert type(t) is torch.Tensor, (name, type(t))  # plain tensors, no stand-ins
        if name.startswith("model.layers.0.mlp.experts.1."):
            kept.append(name)
            model.get_parameter(name).data.copy_(t)
    assert sorted(kept) == [f"model.layers.0.mlp.experts.1.gate_proj.{k}" for k in ("weight", "weight_scale")]
    assert torch.equal(o_proj.data, processed)  # not written back to the checkpoint's bytes
    assert not hasattr(other, "last_stats")

    # A second load_weights of the same model (any loader): plain tensors too.
    model.received.clear()
    again = _loader()
    again.load_weights(model, _config(tmp_path))
    assert {t for _, t in model.received} == {torch.Tensor}
    assert len(model.received) == len(tensors)
    assert torch.equal(o_proj.data, tensors["model.layers.0.self_attn.o_proj.weight"])  # the model's own copy


def test_into_params_off_gives_the_model_plain_tensors(tmp_path):
    tensors, _ = _checkpoint(tmp_path)
    model = _toy_for(tensors)
    loader = _loader(into_params=False)
    loader.load_weights(model, _config(tmp_path))
    assert {t for _, t in model.received} == {torch.Tensor}
    for n, p in model.named_parameters():
        assert torch.equal(p.data, tensors[n]), n


@pytest.mark.parametrize("ep_rank", [0, 3])
def test_eplb_local_expert_ids_are_what_the_model_receives(tmp_path, ep_rank):
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    tensors, _ = _checkpoint(tmp_path)
    local = _eplb_ids(E, 4, 4, ep_rank)  # 12 physical slots, 3 per rank; redundant slot 8+i holds expert i
    assert local == ({0, 1, 2} if ep_rank == 0 else {1, 2, 3})
    wanted = {n for n in tensors if not should_skip_weight(n, local)}
    assert len(wanted) < len(tensors)  # other experts' weights (never their scales) are skipped
    model = _toy_for(tensors, keep=lambda n: n in wanted)
    loader = _loader()
    loader._init_ep_weight_filter = lambda *a: setattr(loader, "local_expert_ids", local)
    loader.load_weights(model, _config(tmp_path))
    assert {n for n, _ in model.received} == wanted
    for n, p in model.named_parameters():
        assert torch.equal(p.data, tensors[n]), n
    s = loader.last_stats
    assert s["loose"] == 0 and s["confirmed"] == s["placements"] > 0
    skipped = sum(t.numel() * t.element_size() for n, t in tensors.items() if n not in wanted)
    assert s["total_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values()) - skipped
    assert s["bytes_read"] < s["total_bytes"] + skipped // 2  # other experts' bytes unread

    # The plain stream (reload, EPLB's redistribution) keeps the loader's expert set too.
    loader2 = _loader()
    loader2.local_expert_ids = local
    assert {n for n, _ in loader2.get_all_weights(_config(tmp_path), model)} == wanted


def _vllm_shuffled(files, rank=0):
    out = sorted(files, key=_natural_sort_key)
    random.Random(rank).shuffle(out)
    return out


def test_shuffle_safetensors_files_orders_the_files_as_vllm(tmp_path):
    from vllm.config.load import LoadConfig

    if "shuffle_safetensors_files" not in getattr(LoadConfig, "__dataclass_fields__", {}):
        pytest.skip("this vLLM's LoadConfig has no shuffle_safetensors_files (0.34 has)")
    tensors, files = _checkpoint(tmp_path, files=5)
    order = _vllm_shuffled(files)
    assert order != sorted(files, key=_natural_sort_key)
    file_of = {}
    from safetensors import safe_open

    for f in files:
        with safe_open(f, "pt") as h:
            file_of.update({k: f for k in h.keys()})

    def files_in(names):
        seen = []
        for n in names:
            if not seen or seen[-1] != file_of[n]:
                seen.append(file_of[n])
        return seen

    # A plain stream: tensors file by file, in the shuffled order.
    streamed = [n for n, _ in _loader(shuffle=True).get_all_weights(_config(tmp_path), _toy_for(tensors))]
    assert files_in(streamed) == order
    # The first load: the engine reads in that order (the stand-ins come first, then the rest).
    model = _toy_for(tensors)
    loader = _loader(shuffle=True)
    loader.load_weights(model, _config(tmp_path))
    assert loader.last_stats["placements"] > 0
    for n, p in model.named_parameters():
        assert torch.equal(p.data, tensors[n]), n


class TransformingMapper:
    """A WeightsMapper with weights_transforms (vLLM 0.34): the transforms
    rewrite the raw stream before the name mapping (here: two tensors of one
    shape swap names, one is scaled in place, one is added), then names map
    one to one."""

    SWAP = {"model.embed.weight": "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.self_attn.o_proj.weight": "model.embed.weight"}

    def __init__(self):
        self.weights_transforms = [self._swap, self._scale_in_place, self._fake_bias]

    @classmethod
    def _swap(cls, weights):
        for n, t in weights:
            yield cls.SWAP.get(n, n), t

    @staticmethod
    def _scale_in_place(weights):
        for n, t in weights:
            if n == "model.norm.weight":
                t = t.mul_(2)
            yield n, t

    @staticmethod
    def _fake_bias(weights):
        for n, t in weights:
            yield n, t
            if n == "model.embed.weight":
                yield "model.embed.bias", torch.zeros(t.shape[0], dtype=t.dtype, device=t.device)

    def _map_name_with_shard(self, key):
        return key, None

    def apply(self, weights):
        for transform in self.weights_transforms:
            weights = transform(weights)
        yield from weights


def test_tensors_the_weights_transforms_touch_are_left_to_the_model(tmp_path):
    tensors, _ = _checkpoint(tmp_path)
    model = _toy_for(tensors, mapper=TransformingMapper())
    model.get_submodule("model.embed").register_parameter(
        "bias", torch.nn.Parameter(torch.full((H,), -7, dtype=torch.bfloat16), requires_grad=False))
    loader = _loader()
    loader.load_weights(model, _config(tmp_path))
    s = loader.last_stats
    # Nothing read twice, nothing left loose: the swapped and the scaled tensors were not planned.
    assert s["loose"] == 0 and s["materialized"] == 0 and s["confirmed"] == s["placements"] > 0
    assert s["direct_tensors"] == len(tensors) - 3 and s["model_tensors"] == 3
    want = dict(TransformingMapper().apply((n, t.clone()) for n, t in tensors.items()))
    for n, p in model.named_parameters():
        assert torch.equal(p.data, want[n]), n


def _load_model_events(tmp_path, monkeypatch, fail_in_load_weights=False, on_create=None, **extra):
    """Runs the loader's load_model (vLLM's BaseModelLoader.load_model around a
    Toy: construction stubbed, post-processing recorded) and returns what
    happened in order: create, load_weights, post, and every gc.collect(g).
    on_create: called during the construction."""
    import gc

    from vllm.model_executor.model_loader import base_loader

    tensors, _ = _checkpoint(tmp_path)
    events: list = []
    real_collect = gc.collect

    def collect(generation=2):
        events.append(("gc", generation))
        return real_collect(generation)

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(base_loader.BaseModelLoader, "create_model",
                        lambda self, *a, **k: events.append("create") or (on_create and on_create())
                        or _toy_for(tensors))
    monkeypatch.setattr(base_loader, "process_weights_after_loading", lambda *a, **k: events.append("post"))
    loader = _loader(**extra)
    load_weights = loader.load_weights

    def recorded_load_weights(model, model_config):
        events.append("load_weights")
        if fail_in_load_weights:
            raise RuntimeError("a load that fails")
        return load_weights(model, model_config)

    loader.load_weights = recorded_load_weights
    cfg = _config(tmp_path)
    cfg.dtype = torch.float32
    vllm_config = types.SimpleNamespace(device_config=types.SimpleNamespace(device="cpu"),
                                        load_config=loader.load_config, quant_config=None)
    try:
        model = loader.load_model(vllm_config, cfg)
    except RuntimeError:
        model = None
    assert base_loader.gc is gc  # vLLM's module as it was, whatever happened
    if model is not None:
        for n, p in model.named_parameters():
            assert torch.equal(p.data, tensors[n]), n
        s = loader.last_stats
        if extra.get("read_ahead", True):  # mapped parameters read in while vLLM post-processed, waited for
            assert s["mapped_tensors"] > 0 and s["mapped_populate"]["late"], s
            assert s["mapped_populate"]["bytes"] == s["mapped_bytes"]
        else:
            assert "mapped_populate" not in s
    return events


def test_vllms_full_collection_runs_while_the_read_ahead_reads(tmp_path, monkeypatch):
    """_collect.py: the full gc.collect() vLLM runs after load_weights runs
    right after construction (the read-ahead reading); vLLM's call after
    load_weights collects the young generation; the one after
    post-processing stays full."""
    events = _load_model_events(tmp_path, monkeypatch)
    assert events == ["create", ("gc", 2), "load_weights", ("gc", 1), "post", ("gc", 2)], events


def test_collect_early_false_keeps_vllms_order(tmp_path, monkeypatch):
    from weightlift.vllm_plugin._options import Options

    assert Options.parse({})[0].collect_early is True
    with pytest.raises(ValueError, match="collect_early must be a bool, got 'no'"):
        Options.parse({"collect_early": "no"})
    events = _load_model_events(tmp_path, monkeypatch, collect_early=False)
    assert events == ["create", "load_weights", ("gc", 2), "post", ("gc", 2)], events
    # No read-ahead, no move either.
    (tmp_path / "no-read-ahead").mkdir()
    events = _load_model_events(tmp_path / "no-read-ahead", monkeypatch, read_ahead=False)
    assert events == ["create", "load_weights", ("gc", 2), "post", ("gc", 2)], events


def test_freeze_gc_leaves_the_older_heap_out_of_load_models_collections(tmp_path, monkeypatch):
    """freeze_gc: what existed before load_model is frozen for its length, so
    vLLM's collections in it walk only what the load created (garbage made
    during the load is collected there, older garbage by the next full
    collection after it); unfrozen after; a process that froze objects
    itself is left as it was."""
    import gc
    import weakref

    from weightlift.vllm_plugin._options import Options

    assert Options.parse({})[0].freeze_gc is False
    with pytest.raises(ValueError, match="freeze_gc must be a bool, got 1"):
        Options.parse({"freeze_gc": 1})

    class Node:
        pass

    def garbage_cycle():
        a, b = Node(), Node()
        a.b, b.a = b, a
        return weakref.ref(a)

    assert gc.get_freeze_count() == 0
    gc.disable()  # only the explicit collections run
    try:
        old = garbage_cycle()
        seen = {}

        def on_create():
            seen["frozen"] = gc.get_freeze_count()
            seen["new"] = garbage_cycle()

        events = _load_model_events(tmp_path, monkeypatch, freeze_gc=True, on_create=on_create)
        assert events == ["create", ("gc", 2), "load_weights", ("gc", 1), "post", ("gc", 2)], events
        assert seen["frozen"] > 0
        assert seen["new"]() is None  # collected inside load_model
        assert old() is not None  # frozen there, not walked
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert old() is None
        # Without the option, load_model's collections take the older garbage too.
        (tmp_path / "default").mkdir()
        old = garbage_cycle()
        _load_model_events(tmp_path / "default", monkeypatch)
        assert old() is None
        # A process that froze its heap itself: nothing frozen or unfrozen by the loader.
        gc.freeze()
        frozen = gc.get_freeze_count()
        (tmp_path / "app-frozen").mkdir()
        _load_model_events(tmp_path / "app-frozen", monkeypatch, freeze_gc=True)
        # (never unfrozen, nothing added; a frozen object freed by its refcount leaves the count)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_failed_load_model_leaves_vllms_gc_in_place(tmp_path, monkeypatch):
    events = _load_model_events(tmp_path, monkeypatch, fail_in_load_weights=True)
    assert events == ["create", ("gc", 2), "load_weights"], events
