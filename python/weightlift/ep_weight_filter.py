"""Expert-parallel weight filtering: which expert weights this rank may skip
before reading them (the reference's ep_weight_filter semantics).

An expert weight is named "...experts.<id>.<rest>"; fused 3-D expert tensors
("...experts.gate_proj.weight") carry no id and are never skipped, nor are
scales and other metadata: only names ending in ".weight" or ".weight_packed".
"""
from __future__ import annotations

import re

_EXPERT_ID = re.compile(r"\.experts\.(\d+)\.")


def parse_expert_id(name: str) -> int | None:
    """The expert index in a weight name, or None for dense / shared / fused weights."""
    m = _EXPERT_ID.search(name)
    return int(m.group(1)) if m else None


def compute_local_expert_ids(num_experts: int, ep_size: int, ep_rank: int,
                             placement: str = "linear") -> set[int] | None:
    """The experts rank `ep_rank` of `ep_size` holds; None when EP is off (ep_size <= 1).

    linear: contiguous blocks, the first `num_experts % ep_size` ranks one larger.
    round_robin: experts ep_rank, ep_rank + ep_size, ...
    """
    if ep_size <= 1:
        return None
    if placement == "linear":
        base, rem = divmod(num_experts, ep_size)
        start = ep_rank * base + min(ep_rank, rem)
        count = base + (1 if ep_rank < rem else 0)
        return set(range(start, start + count))
    if placement == "round_robin":
        return set(range(ep_rank, num_experts, ep_size))
    raise ValueError(f"Unknown expert placement strategy: {placement}")


def should_skip_weight(name: str, local_expert_ids: set[int] | None) -> bool:
    """True when `name` is another rank's expert weight (never for scales)."""
    if local_expert_ids is None:
        return False
    eid = parse_expert_id(name)
    if eid is None:
        return False
    if not name.endswith((".weight", ".weight_packed")):
        return False
    return eid not in local_expert_ids
