"""The CPUs the engine's threads run on during a load (the plug-in's `cpus`
option). The engine starts its threads from the calling thread, so they
inherit its affinity; `widened(which)` sets that affinity for the duration
of one engine call and puts it back after.

    inherit   the worker's own binding (vLLM's CPU backend pins a worker to
              its compute cores: on a small machine, one core for the load)
    node      every CPU of the NUMA node(s) the worker is bound to (default):
              parameter pages are first touched by the engine's threads, so
              they stay on the worker's node, and the node's idle cores help
    all       every CPU the process's cgroup allows

A leaf module: no vLLM, no torch.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

CHOICES = ("inherit", "node", "all")
_NODES = "/sys/devices/system/node"


def parse_cpulist(text: str) -> set[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as a set; empty on junk."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            return set()
        if a < 0 or b < a or b - a > 1 << 16:
            return set()
        cpus.update(range(a, b + 1))
    return cpus


def node_cpus(nodes_dir: str = _NODES) -> list[set[int]]:
    """The CPUs of each NUMA node the kernel lists (empty where it lists none)."""
    try:
        names = [n for n in os.listdir(nodes_dir) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return []
    out = []
    for n in sorted(names, key=lambda s: int(s[4:])):
        try:
            with open(os.path.join(nodes_dir, n, "cpulist")) as f:
                cpus = parse_cpulist(f.read())
        except OSError:
            continue
        if cpus:
            out.append(cpus)
    return out


def target(which: str, current: set[int], nodes: list[set[int]], ncpu: int) -> set[int] | None:
    """The affinity to run the engine's threads with, or None to leave it."""
    if which not in CHOICES:
        raise ValueError(f"cpus must be one of {list(CHOICES)}, got {which!r}")
    if which == "inherit":
        return None
    if which == "all" or not nodes:
        wide = set(range(max(ncpu, 1)))
    else:
        wide = set().union(*(n for n in nodes if n & current)) or set(current)
    wide |= current
    return None if wide == current else wide


@contextlib.contextmanager
def widened(which: str, nodes_dir: str = _NODES, beside: bool = False) -> Iterator[set[int] | None]:
    """The calling thread's affinity widened as `which` says for the block
    (the kernel keeps it inside the cgroup's cpuset); yields the set in force,
    None when left as it was. beside: only the CPUs the thread was not bound
    to, when there are any (threads started in the block then run beside the
    caller's own work, e.g. vLLM building the model, not on its cores)."""
    if which == "inherit" or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    wide = target(which, set(before), node_cpus(nodes_dir), os.cpu_count() or 1)
    if wide is None:
        yield None
        return
    if beside and wide - set(before):
        wide = wide - set(before)
    try:
        os.sched_setaffinity(0, wide)
    except OSError:
        yield None
        return
    try:
        yield os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)
