"""The plug-in's `cpus` option (vllm_plugin/_affinity.py), without vLLM:
the kernel's CPU lists, the widened set for each choice on one and two NUMA
nodes, and the calling thread's affinity put back after the block."""
from __future__ import annotations

import os
import threading

import pytest

from weightlift.vllm_plugin import _affinity as aff


def test_cpulist_parses_the_kernels_format_and_refuses_junk():
    assert aff.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert aff.parse_cpulist("5") == {5}
    assert aff.parse_cpulist("") == set()
    for bad in ("3-1", "a-b", "-1", "0-99999999"):
        assert aff.parse_cpulist(bad) == set(), bad


def _nodes(tmp_path, lists):
    for i, text in enumerate(lists):
        (tmp_path / f"node{i}").mkdir()
        (tmp_path / f"node{i}" / "cpulist").write_text(text + "\n")
    (tmp_path / "possible").write_text("0-1\n")  # not a node folder: ignored
    return str(tmp_path)


def test_node_cpus_reads_every_node_in_order(tmp_path):
    d = _nodes(tmp_path, ["0-3", "4-7"])
    assert aff.node_cpus(d) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert aff.node_cpus(str(tmp_path / "absent")) == []


def test_target_for_each_choice():
    two = [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert aff.target("inherit", {1}, two, 8) is None
    assert aff.target("node", {1}, two, 8) == {0, 1, 2, 3}  # the worker's node only
    assert aff.target("node", {3, 4}, two, 8) == set(range(8))  # bound across both
    assert aff.target("all", {1}, two, 8) == set(range(8))
    assert aff.target("node", {1}, [], 2) == {0, 1}  # no NUMA facts: every CPU
    assert aff.target("node", {0, 1, 2, 3}, two, 8) is None  # already the whole node
    with pytest.raises(ValueError, match="cpus must be one of"):
        aff.target("some", {0}, two, 8)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity")
def test_widened_sets_the_block_and_restores_the_thread(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to widen")
    seen = {}

    def worker():
        os.sched_setaffinity(0, {allowed[0]})
        d = _nodes(tmp_path, [",".join(map(str, allowed))])
        with aff.widened("node", d) as inside:
            seen["inside"] = inside
            # A thread started here (as the engine's are) inherits the widened set.
            t = threading.Thread(target=lambda: seen.setdefault("child", os.sched_getaffinity(0)))
            t.start()
            t.join()
        seen["after"] = os.sched_getaffinity(0)
        with aff.widened("inherit", d) as inside:
            seen["inherit"] = (inside, os.sched_getaffinity(0))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["inside"] == set(allowed) and seen["child"] == set(allowed)
    assert seen["after"] == {allowed[0]}
    assert seen["inherit"] == (None, {allowed[0]})


def test_beside_leaves_out_the_callers_own_cpus(tmp_path):
    """The read-ahead's threads start beside vLLM's construction, not on its core."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing beside it")
    seen = {}

    def worker():
        os.sched_setaffinity(0, {allowed[0]})
        d = _nodes(tmp_path, [",".join(map(str, allowed))])
        with aff.widened("node", d, beside=True) as inside:
            seen["inside"] = inside
        seen["after"] = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(allowed))  # bound to every CPU already: nothing beside, left as it is
        with aff.widened("node", d, beside=True) as inside:
            seen["all"] = inside

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["inside"] == set(allowed[1:])
    assert seen["after"] == {allowed[0]}
    assert seen["all"] is None
