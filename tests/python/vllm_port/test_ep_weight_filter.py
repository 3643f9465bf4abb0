"""Port of vLLM's tests/model_executor/model_loader/test_ep_weight_filter.py
against weightlift (rewritten; same cases and expectations). The GPT-2 cases
need the Hub; they run on a synthetic dense model instead."""
import pytest
import torch
from safetensors.torch import save_file

from weightlift.vllm_compat import (
    compute_local_expert_ids,
    parse_expert_id,
    safetensors_weights_iterator,
    should_skip_weight,
)


@pytest.mark.parametrize("name,expected", [
    ("model.layers.0.mlp.experts.42.gate_proj.weight", 42),
    ("model.layers.60.mlp.experts.383.down_proj.weight", 383),
    ("model.layers.5.mlp.experts.100.gate_proj.weight_scale", 100),
    ("model.layers.0.mlp.experts.0.up_proj.weight", 0),
    ("model.layers.0.mlp.shared_experts.gate_proj.weight", None),
    ("model.layers.0.self_attn.q_proj.weight", None),
    ("model.embed_tokens.weight", None),
    ("model.layers.0.input_layernorm.weight", None),
    ("model.layers.0.mlp.experts.gate_proj.weight", None),  # fused 3-D: no id
    ("model.layers.10.mlp.experts.down_proj.weight", None),
])
def test_parse_expert_id(name, expected):
    assert parse_expert_id(name) == expected


def test_local_ids_ep_off():
    assert compute_local_expert_ids(64, ep_size=1, ep_rank=0) is None


def test_local_ids_even():
    assert compute_local_expert_ids(64, ep_size=8, ep_rank=0) == set(range(8))
    assert compute_local_expert_ids(64, ep_size=8, ep_rank=7) == set(range(56, 64))


def test_local_ids_uneven():
    parts = [compute_local_expert_ids(10, ep_size=3, ep_rank=r) for r in range(3)]
    assert [len(p) for p in parts] == [4, 3, 3]
    assert parts[0] | parts[1] | parts[2] == set(range(10))
    assert parts[0].isdisjoint(parts[1]) and parts[1].isdisjoint(parts[2])


@pytest.mark.parametrize("ep,per_rank", [(8, 48), (16, 24), (24, 16)])
def test_local_ids_384_experts(ep, per_rank):
    seen = set()
    for r in range(ep):
        ids = compute_local_expert_ids(384, ep_size=ep, ep_rank=r)
        assert len(ids) == per_rank
        seen |= ids
    assert seen == set(range(384))


def test_round_robin():
    rr = "round_robin"
    assert compute_local_expert_ids(8, 2, 0, placement=rr) == {0, 2, 4, 6}
    assert compute_local_expert_ids(8, 2, 1, placement=rr) == {1, 3, 5, 7}
    assert compute_local_expert_ids(10, 3, 0, placement=rr) == {0, 3, 6, 9}
    assert compute_local_expert_ids(10, 3, 1, placement=rr) == {1, 4, 7}
    assert compute_local_expert_ids(10, 3, 2, placement=rr) == {2, 5, 8}
    seen = set()
    for r in range(8):
        ids = compute_local_expert_ids(384, 8, r, placement=rr)
        assert len(ids) == 48 and seen.isdisjoint(ids)
        seen |= ids
    assert seen == set(range(384))


def test_unknown_placement():
    with pytest.raises(ValueError, match="Unknown expert placement strategy: diagonal"):
        compute_local_expert_ids(8, 2, 0, placement="diagonal")


LOCAL = compute_local_expert_ids(384, ep_size=8, ep_rank=0)  # experts 0..47


@pytest.mark.parametrize("name,ids,skip", [
    ("anything", None, False),
    ("model.layers.0.self_attn.q_proj.weight", LOCAL, False),
    ("model.layers.0.mlp.experts.10.gate_proj.weight", LOCAL, False),
    ("model.layers.0.mlp.experts.200.gate_proj.weight", LOCAL, True),
    ("model.layers.0.mlp.experts.10.gate_proj.weight_packed", LOCAL, False),
    ("model.layers.0.mlp.experts.200.gate_proj.weight_packed", LOCAL, True),
    ("model.layers.0.mlp.experts.200.gate_proj.weight_scale", LOCAL, False),  # scales are never skipped
    ("model.layers.0.mlp.experts.47.gate_proj.weight", LOCAL, False),
    ("model.layers.0.mlp.experts.48.gate_proj.weight", LOCAL, True),
    ("model.layers.0.mlp.shared_experts.gate_proj.weight", LOCAL, False),
    ("model.embed_tokens.weight", LOCAL, False),
    ("model.layers.0.mlp.experts.gate_proj.weight", LOCAL, False),
])
def test_should_skip_weight(name, ids, skip):
    assert should_skip_weight(name, ids) is skip


@pytest.fixture
def dense_files(tmp_path):
    save_file({"wte.weight": torch.randn(10, 4), "h.0.attn.c_attn.weight": torch.randn(4, 12)},
              str(tmp_path / "model.safetensors"))
    return [str(tmp_path / "model.safetensors")]


@pytest.mark.parametrize("ids", [None, set()])
def test_dense_model_never_filtered(dense_files, ids):
    everything = dict(safetensors_weights_iterator(dense_files, False))
    filtered = dict(safetensors_weights_iterator(dense_files, False, local_expert_ids=ids))
    assert set(everything) == set(filtered)


@pytest.fixture
def moe_files(tmp_path):
    t = {"model.embed_tokens.weight": torch.randn(100, 64),
         "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64),
         "model.layers.0.input_layernorm.weight": torch.randn(64),
         "model.layers.0.mlp.shared_experts.gate_proj.weight": torch.randn(128, 64)}
    for e in range(8):
        t[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] = torch.randn(128, 64)
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] = torch.randn(128, 64)
        t[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] = torch.randn(64, 128)
    p = str(tmp_path / "model-00001-of-00001.safetensors")
    save_file(t, p)
    return [p], t


DENSE = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
         "model.layers.0.input_layernorm.weight", "model.layers.0.mlp.shared_experts.gate_proj.weight"]


def test_moe_no_filter(moe_files):
    files, t = moe_files
    assert set(dict(safetensors_weights_iterator(files, False))) == set(t)


@pytest.mark.parametrize("rank", [0, 1])
def test_moe_ep2(moe_files, rank):
    files, _ = moe_files
    ids = compute_local_expert_ids(8, ep_size=2, ep_rank=rank)
    loaded = dict(safetensors_weights_iterator(files, False, local_expert_ids=ids))
    experts = [n for n in loaded if parse_expert_id(n) is not None]
    assert len(experts) == 12 and all(parse_expert_id(n) in ids for n in experts)
    assert all(n in loaded for n in DENSE)


@pytest.mark.parametrize("strategy", [None, "eager"])
def test_moe_ep8_covers_all(moe_files, strategy):
    files, _ = moe_files
    union = set()
    for r in range(8):
        ids = compute_local_expert_ids(8, ep_size=8, ep_rank=r)
        loaded = dict(safetensors_weights_iterator(files, False, strategy, local_expert_ids=ids))
        experts = {n for n in loaded if parse_expert_id(n) is not None}
        assert len(experts) == 3
        union |= experts
    assert len(union) == 24


def test_moe_filtered_values_equal(moe_files):
    files, _ = moe_files
    everything = dict(safetensors_weights_iterator(files, False))
    ids = compute_local_expert_ids(8, ep_size=2, ep_rank=0)
    for n, t in safetensors_weights_iterator(files, False, local_expert_ids=ids):
        assert torch.equal(t, everything[n]), n
