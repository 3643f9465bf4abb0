"""The Python face on the engine: loading straight into the caller's tensors,
the zero-copy file views every iterator yields, the typed engine options,
and the reference surface that rides on C++ rules (quant configs, torchao,
prefetch helpers)."""
import gc
import json
import os
import sys
import types

import pytest
import torch
from safetensors.torch import save_file as st_save_file

import weightlift
from pagecache import drop_cache
from weightlift import _core, vllm_compat
from weightlift import weight_utils as mod


@pytest.fixture
def two_shards(tmp_path):
    g = torch.Generator().manual_seed(3)
    a = {"l.0.q.weight": torch.randn(8, 4, generator=g), "l.0.k.weight": torch.randn(4, 4, generator=g).bfloat16(),
         "l.0.norm": torch.randn(4, generator=g)}
    b = {"l.1.q.weight": torch.randn(8, 4, generator=g), "l.1.ids": torch.arange(6, dtype=torch.int64),
         "l.1.empty": torch.zeros(0, 3)}
    files = [str(tmp_path / "model-00001-of-00002.safetensors"), str(tmp_path / "model-00002-of-00002.safetensors")]
    st_save_file(a, files[0])
    st_save_file(b, files[1])
    return files, {**a, **b}


def _eq(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


# ---- load_into ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["stream", "lazy", "threads"])
def test_load_into_fills_the_callers_tensors_in_place(two_shards, strategy):
    files, ref = two_shards
    params = {k: torch.full_like(v, 0) if v.numel() else torch.empty_like(v) for k, v in ref.items()}
    ptrs = {k: v.data_ptr() for k, v in params.items()}
    r = weightlift.load_into(files, params, strategy=strategy, threads=2)
    assert r["direct"] == len(ref) and r["copied"] == 0 and r["fallback"] == 0
    assert r["bytes"] == sum(v.numel() * v.element_size() for v in ref.values())
    for k in ref:
        assert _eq(params[k], ref[k]), k
        assert params[k].data_ptr() == ptrs[k]  # the same memory, no tensor in between


def test_load_into_module_copies_other_dtypes_and_uses_fallback(two_shards, tmp_path):
    files, ref = two_shards

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q0 = torch.nn.Parameter(torch.zeros(8, 4))
            self.k0 = torch.nn.Parameter(torch.zeros(4, 4))  # f32 here, bf16 in the file: copied by torch
            self.register_buffer("ids", torch.zeros(6, dtype=torch.int64))

    m = M()
    names = {"l.0.q.weight": "q0", "l.0.k.weight": "k0", "l.1.ids": "ids"}
    params = {ck: dict(list(m.named_parameters()) + list(m.named_buffers()))[mine] for ck, mine in names.items()}
    seen = {}
    r = weightlift.load_into(files, params, fallback=lambda n, w: seen.__setitem__(n, w.clone()))
    assert (r["direct"], r["copied"], r["fallback"]) == (2, 1, 3)
    assert _eq(m.q0.data, ref["l.0.q.weight"]) and _eq(m.ids, ref["l.1.ids"])
    assert torch.equal(m.k0.data, ref["l.0.k.weight"].float())
    assert set(seen) == {"l.0.norm", "l.1.q.weight", "l.1.empty"}
    assert _eq(seen["l.1.q.weight"], ref["l.1.q.weight"])


def test_load_into_stacked_slices(two_shards):
    """vLLM's stacked parameters: map each checkpoint name to its slice of the stack."""
    files, ref = two_shards
    qk = torch.zeros(16, 4)
    params = {"l.0.q.weight": qk[:8], "l.1.q.weight": qk[8:]}
    weightlift.load_into(files, params, fallback=lambda n, w: None)
    assert torch.equal(qk, torch.cat([ref["l.0.q.weight"], ref["l.1.q.weight"]]))


def test_load_into_without_destination_is_an_error_before_reading(two_shards):
    files, ref = two_shards
    params = {"l.0.q.weight": torch.zeros(8, 4)}
    with pytest.raises(KeyError, match="5 checkpoint tensors have no destination"):
        weightlift.load_into(files, params)
    assert torch.count_nonzero(params["l.0.q.weight"]) == 0


def test_load_into_shape_mismatch_names_the_tensor(two_shards):
    files, _ = two_shards
    params = {"l.0.q.weight": torch.zeros(4, 8)}
    with pytest.raises(AssertionError, match=r"Attempted to load weight \(torch.Size\(\[8, 4\]\)\)"):
        weightlift.load_into(files, params, fallback=lambda n, w: None)


# ---- file views ---------------------------------------------------------------------------------------------


def test_views_outlive_the_iterator_and_release_on_drop(two_shards):
    files, ref = two_shards
    it = vllm_compat.safetensors_weights_iterator(files, False)
    kept = dict(it)
    del it
    gc.collect()
    for k in ref:
        assert _eq(kept[k], ref[k]), k
    kept["l.0.q.weight"].add_(1)  # private: never reaches the file nor the next reader
    again = dict(vllm_compat.safetensors_weights_iterator(files, False))
    assert _eq(again["l.0.q.weight"], ref["l.0.q.weight"])


def test_stream_weights_buffers_and_views_agree(two_shards):
    files, ref = two_shards
    for views in (True, False):
        got = dict(weightlift.stream_weights(files, "lazy", file_views=views))
        assert set(got) == set(ref)
        assert all(_eq(got[k], ref[k]) for k in ref)


def test_engine_options_are_typed():
    o = mod._options(strategy="stream", threads=3, order="name", direct="off", shard_rules=["*.q:0"])
    assert (o.strategy, o.threads, o.order, o.direct, o.shard_rules) == ("stream", 3, "name", "off", ["*.q:0"])
    with pytest.raises(ValueError, match="order must be offset, name or listed, not 'random'"):
        mod._options(order="random")
    with pytest.raises(ValueError, match="no option 'colour'"):
        mod._options(colour="blue")
    with pytest.raises(ValueError, match="shard rule"):
        mod._options(shard_rules=["nodim"])


def test_multi_thread_rejects_zero_workers(two_shards):
    files, _ = two_shards
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        list(vllm_compat.multi_thread_safetensors_weights_iterator(files, False, max_workers=0))


# ---- thin helpers over C++ ------------------------------------------------------------------------------------


def test_prefetch_helpers_are_the_engines(two_shards, caplog):
    files, _ = two_shards
    assert mod._get_checkpoints_size_bytes(files) == sum(os.path.getsize(f) for f in files)
    assert mod._get_available_ram_bytes() > 0
    assert mod._get_fs_type(files) == _core.filesystem_type(files[0])
    mod._prefetch_checkpoint(files[0], block_size=7)
    mod._prefetch_all_checkpoints(files, num_prefetch_threads=2, block_size=1 << 20)
    mod._prefetchers[-1].wait()
    assert _core.prefetch_decision("nfs", 10, 100, False)[0] is True
    assert _core.prefetch_decision("ext4", 10, 100, False)[0] is False
    assert _core.prefetch_decision("ext4", 100, 10, True)[:2] == (True, True)  # forced: a warning


def test_prefetch_decision_is_one_engine_call(two_shards, tmp_path):
    files, _ = two_shards
    total = sum(os.path.getsize(f) for f in files)
    d = _core.decide_prefetch(files, False)  # every fact measured by the engine
    assert (d.fstype, d.checkpoint_bytes) == (_core.filesystem_type(files[0]), total)
    assert d.available_bytes > 0
    assert (d.prefetch, d.warn, d.reason) == _core.prefetch_decision(d.fstype, total, d.available_bytes, False)
    # A fact the caller gives wins; the others are still measured.
    nfs = _core.decide_prefetch(files, False, fstype="nfs", available_bytes=10 * total)
    assert (nfs.prefetch, nfs.warn, nfs.fstype, nfs.checkpoint_bytes) == (True, False, "nfs", total)
    assert "network filesystem and it fits in 90% of RAM" in nfs.reason
    tight = _core.decide_prefetch(files, False, fstype="nfs", checkpoint_bytes=100, available_bytes=100)
    assert (tight.prefetch, tight.warn) == (False, True)
    forced = _core.decide_prefetch(files, True, fstype="ext4", checkpoint_bytes=100, available_bytes=10)
    assert (forced.prefetch, forced.warn) == (True, True)
    empty = _core.decide_prefetch([], False)
    assert (empty.prefetch, empty.fstype, empty.checkpoint_bytes) == (False, "", 0)
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        _core.decide_prefetch([str(tmp_path / "nope.safetensors")], False)


def test_auto_prefetch_asks_the_engine_once(two_shards, monkeypatch):
    files, ref = two_shards
    calls = []
    real = _core.decide_prefetch
    monkeypatch.setattr(_core, "decide_prefetch", lambda f, r, **k: calls.append((f, r, k)) or real(f, r, **k))
    for fact in ("filesystem_type", "checkpoint_size_bytes", "available_ram_bytes", "prefetch_decision"):
        monkeypatch.setattr(_core, fact, lambda *a, fact=fact: pytest.fail(f"_core.{fact} asked on its own"))
    assert set(dict(vllm_compat.safetensors_weights_iterator(files, False))) == set(ref)
    assert calls == [(files, False, {})]  # the engine measured every fact itself
    # A fact helper vLLM's tests patch is asked, and only its answer passed in.
    monkeypatch.setattr(mod, "_get_fs_type", lambda f: "ext4")
    monkeypatch.setattr(mod, "_get_available_ram_bytes", lambda: 1 << 40)
    list(vllm_compat.safetensors_weights_iterator(files, False, "prefetch"))
    assert calls[-1] == (files, True, {"fstype": "ext4", "available_bytes": 1 << 40})
    mod._prefetchers[-1].wait()


def test_torchao_strategy_needs_torchao(two_shards, monkeypatch):
    files, _ = two_shards
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(ValueError, match="torchao version >= 0.15.0"):
        list(vllm_compat.safetensors_weights_iterator(files, False, "torchao"))


def test_torchao_strategy_rebuilds_across_files(two_shards, monkeypatch):
    """unflatten_tensor_state_dict gets each file's tensors plus the previous leftovers."""
    files, ref = two_shards
    calls = []

    def unflatten(state, metadata):
        calls.append(sorted(state))
        if "l.1.ids" in state:  # the last file: everything is complete
            return dict(state), {}
        done = {k: v for k, v in state.items() if not k.endswith("q.weight")}
        return done, {k: v for k, v in state.items() if k not in done}

    pkg = types.ModuleType("torchao")
    sub = types.ModuleType("torchao.prototype.safetensors.safetensors_support")
    sub.unflatten_tensor_state_dict = unflatten
    for name, m in (("torchao", pkg), ("torchao.prototype", types.ModuleType("p")),
                    ("torchao.prototype.safetensors", types.ModuleType("s")),
                    ("torchao.prototype.safetensors.safetensors_support", sub)):
        monkeypatch.setitem(sys.modules, name, m)
    got = dict(vllm_compat.safetensors_weights_iterator(files, False, "torchao"))
    assert calls[1] == sorted(["l.0.q.weight", "l.1.q.weight", "l.1.ids", "l.1.empty"])
    assert set(got) == set(ref)


def _model_config(folder, quantization, hf_config=None, hf_overrides=None):
    return types.SimpleNamespace(model=str(folder), quantization=quantization, hf_config=hf_config,
                                 hf_overrides=hf_overrides or {}, quantization_config=None, revision=None)


def test_get_quant_config_without_vllm(tmp_path):
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    load = types.SimpleNamespace(download_dir=None)
    r = vllm_compat.get_quant_config(_model_config(tmp_path, "gptq", hf_config={}), load)
    assert isinstance(r, weightlift.weight_utils.QuantizationConfigResult)
    assert (r.quantization, r.source, r.config) == ("gptq", "file", {"bits": 4, "group_size": 128})
    assert r.file == str(tmp_path / "quantize_config.json")
    r = vllm_compat.get_quant_config(_model_config(tmp_path, "awq", hf_config={"quantization_config": {"w": 1}}),
                                     load)
    assert (r.source, r.config) == ("hf_config", {"w": 1})
    with pytest.raises(ValueError, match="quantization method is not specified"):
        vllm_compat.get_quant_config(_model_config(tmp_path, None), load)
    with pytest.raises(ValueError, match="hf_overrides must be a dict"):
        vllm_compat.get_quant_config(types.SimpleNamespace(model=str(tmp_path), quantization="awq", hf_config={},
                                                           hf_overrides="x", quantization_config=None), load)


def test_get_sparse_attention_config(tmp_path):
    load = types.SimpleNamespace(download_dir=None)
    mc = _model_config(tmp_path, None)
    assert vllm_compat.get_sparse_attention_config(mc, load) == {}
    (tmp_path / "sparse_attention_config.json").write_text('{"pattern": "local", "block": 64}')
    assert vllm_compat.get_sparse_attention_config(mc, load) == {"pattern": "local", "block": 64}


def test_dummy_values_are_the_engines():
    p = torch.empty(1000, dtype=torch.float32)
    vllm_compat.initialize_single_dummy_weight(p, seed=5)
    q = torch.empty(1000, dtype=torch.float32).t()  # any layout: the values by index
    vllm_compat.initialize_single_dummy_weight(q, seed=5)
    assert torch.equal(p, q)
    assert ((p >= -1e-3) & (p < 1e-3)).all()


def test_cold_files_keep_the_reference_order(tmp_path):
    """Cold files are read by the engine's stream (O_DIRECT threads, out of
    order); the iterator still yields keys() order, file by file."""
    from safetensors import safe_open as st_safe_open

    g = torch.Generator().manual_seed(5)
    files = []
    for i in range(2):
        t = {f"w.{k:02d}": torch.randn(64, 1024, generator=g) for k in range(12)}
        files.append(str(tmp_path / f"model-{i + 1}.safetensors"))
        st_save_file(t, files[-1])
    drop_cache(files)
    f0 = _core.SafetensorsFile(files[0], "lazy")  # noqa: F841 (header only)
    expected = []
    for f in files:
        with st_safe_open(f, framework="pt") as h:
            expected += [(k, h.get_tensor(k).clone()) for k in h.keys()]
    drop_cache(files)
    got = list(vllm_compat.safetensors_weights_iterator(files, False))
    assert [n for n, _ in got] == [n for n, _ in expected]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected))
