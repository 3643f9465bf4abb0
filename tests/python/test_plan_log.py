"""The engine's plan seen from Python: a dry run (_engine.describe) gives the
plan a load makes, every stream and load_into hand back the log of the plan
that ran, and the vLLM plug-in prints exactly those lines (the engine's own
reasons, not a prediction of them)."""
import logging

import pytest
import torch
from safetensors.torch import save_file

from weightlift import _engine


@pytest.fixture()
def shards(tmp_path):
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"model-0000{i + 1}-of-00002.safetensors"))
        save_file({f"l.{i}.w": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64) + i,
                   f"l.{i}.b": torch.ones(7)}, files[-1])
    return files


def test_a_dry_run_is_the_plan_a_load_makes(shards):
    opts = dict(strategy="stream", threads=3, block_size=8 << 10, direct="off", max_memory=1 << 20)
    dry = _engine.describe(shards, **opts)
    assert (dry["strategy"], dry["direct"], dry["threads"], dry["read_size"], dry["window"]) == \
        ("stream", False, 3, 8 << 10, 1 << 20)
    assert dry["log"][-1] == "stream: 3 threads, 8 KiB reads, buffered, to cpu, memory cap 1 MiB"
    assert dry["text"].startswith("plan: 2 files, 4 tensors, ")
    stats = {}
    got = dict(_engine.iterate(shards, stats=stats, **opts))
    assert set(got) == {"l.0.w", "l.0.b", "l.1.w", "l.1.b"}
    assert stats["log"][:len(dry["log"])] == dry["log"]  # the stream hands back the plan that ran
    stream = _engine.open_stream(shards, max_queued_bytes=1 << 30, **opts)
    list(stream)
    assert stream.describe() == dry["text"]
    assert stream.log()[:len(dry["log"])] == dry["log"]
    stream.close()


def test_the_prefetch_decision_is_the_plans(shards):
    d = _engine.decide_prefetch(shards, False, fstype="nfs", available_bytes=1 << 40)
    plan = _engine.describe(shards, fs_type="nfs", available_bytes=1 << 40)
    assert d.prefetch and plan["strategy"] == "prefetch"
    assert plan["log"][0] == d.reason
    tight = _engine.describe(shards, strategy="prefetch", fs_type="ext4", checkpoint_bytes=100, available_bytes=10)
    assert tight["warnings"] == [tight["log"][0]]  # forced past 90% of RAM: a warning


def test_load_into_hands_back_its_plan(shards):
    targets = {n: torch.empty_like(t) for f in shards for n, t in _load(f).items()}
    items = [(n, t.data_ptr(), t.numel() * t.element_size(), "F32", list(t.shape)) for n, t in targets.items()]
    stats = _engine.load_into(shards, items, strategy="auto", threads=2)
    assert stats["plan"]["strategy"] == "stream"  # auto into the caller's memory
    assert stats["log"][0].startswith("auto: stream (the caller's memory")
    assert stats["log"][:len(stats["plan"]["log"])] == stats["plan"]["log"]
    for f in shards:
        for n, t in _load(f).items():
            assert torch.equal(targets[n], t)


def test_the_vllm_plugin_prints_the_plan_that_ran(shards, caplog):
    from weightlift.vllm_plugin import _progress

    stats = {}
    list(_engine.iterate(shards, stats=stats, strategy="auto", order="name", file_views=True))
    targets = {n: torch.empty_like(t) for f in shards for n, t in _load(f).items()}
    items = [(n, t.data_ptr(), t.numel() * t.element_size(), "F32", list(t.shape)) for n, t in targets.items()]
    direct = _engine.load_into(shards, items, strategy="auto")
    with caplog.at_level(logging.INFO, logger="weightlift.vllm"):
        _progress.log_plan(direct)
        _progress.log_plan(stats)
    printed = [r.getMessage() for r in caplog.records if r.name == "weightlift.vllm"]
    assert printed == ["weightlift: " + line for line in direct["log"] + stats["log"]]
    assert any("auto: stream (the caller's memory" in p for p in printed)
    assert any(p.startswith("weightlift: auto: ") and "network filesystem" in p for p in printed)  # the rule's reason


def _load(path):
    from safetensors.torch import load_file

    return load_file(path)
