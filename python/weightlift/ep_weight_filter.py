"""Expert-parallel weight filtering (the reference's ep_weight_filter): which
expert weights this rank may skip before reading them. The rules are the
engine's (weightlift/expert_filter.h), which the iterators apply in their
load plan so that other ranks' experts are never read.

An expert weight is named "...experts.<id>.<rest>"; fused 3-D expert tensors
("...experts.gate_proj.weight") carry no id and are never skipped, nor are
scales and other metadata: only names ending in ".weight" or ".weight_packed".
"""
from __future__ import annotations

from . import _engine


def parse_expert_id(weight_name: str) -> int | None:
    """The expert index in a weight name, or None for dense / shared / fused weights."""
    return _engine.parse_expert_id(weight_name)


def compute_local_expert_ids(num_experts: int, ep_size: int, ep_rank: int,
                             placement: str = "linear") -> set[int] | None:
    """The experts rank `ep_rank` of `ep_size` holds; None when EP is off (ep_size <= 1).

    linear: contiguous blocks, the first `num_experts % ep_size` ranks one larger.
    round_robin: experts ep_rank, ep_rank + ep_size, ...
    """
    return _engine.compute_local_expert_ids(num_experts, ep_size, ep_rank, placement)


def should_skip_weight(weight_name: str, local_expert_ids: set[int] | None) -> bool:
    """True when `weight_name` is another rank's expert weight (never for scales)."""
    return _engine.should_skip_weight(weight_name, local_expert_ids)


def compute_eplb_local_expert_ids(num_experts: int, num_redundant_experts: int, ep_size: int,
                                  ep_rank: int) -> set[int] | None:
    """The logical experts rank `ep_rank` must load with EPLB on (vLLM 0.34):
    the `num_experts + num_redundant_experts` physical slots split linearly
    over the ranks, each slot holding the logical expert of EPLB's initial
    map (slot p < num_experts: expert p; redundant slot num_experts + i:
    expert i % num_experts). None when EP is off (ep_size <= 1)."""
    physical = compute_local_expert_ids(num_experts + num_redundant_experts, ep_size, ep_rank, "linear")
    if physical is None:
        return None
    return {p if p < num_experts else (p - num_experts) % num_experts for p in physical}
