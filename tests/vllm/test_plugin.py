"""`--load-format weightlift` against vLLM's own loader, in vLLM's default
process mode (the model is loaded in a spawned worker): greedy tokens
identical under `vllm serve` (local folder), greedy tokens and top-5
logprobs identical from a local folder, S3, the Hub and at tensor parallel 2."""
from __future__ import annotations

import json
import os
import re

import pytest


def _same_generation(a, b):
    assert a.tokens == b.tokens
    assert a.logprobs == b.logprobs


def _bar(log: str) -> list[tuple[int, int]]:
    """(n, total) of each progress-bar line in a log."""
    return [(int(n), int(t)) for n, t in
            re.findall(r"Loading safetensors checkpoint shards: +\d+% Completed \| (\d+)/(\d+)", log)]


def test_vllm_serve_with_weightlift_equals_vllms_own_loader(runs, model_bytes):
    """`vllm serve MODEL --load-format weightlift` (vLLM's OpenAI server, its default process mode:
    the model is loaded in a worker it spawns) gives the greedy tokens of vLLM's own loader."""
    ref, ours = runs("auto-tp1"), runs("weightlift-serve")
    assert ours.tokens == ref.tokens
    # The plug-in ran in the worker.
    assert len(ours.stats) == 1
    s = ours.stats[0]
    assert "Loading weights took" in ours.log
    # Straight into the parameters: every tensor that lands unchanged (embeddings, q/k/v and gate/up parts,
    # o_proj, down_proj); the float32 norms through the model's load_weights; nothing read twice.
    assert s["placements"] > 0 and s["confirmed"] == s["placements"] and s["loose"] == 0
    assert s["materialized"] == 0
    assert s["direct_bytes"] + s["model_bytes"] == model_bytes
    assert s["model_bytes"] < 0.01 * s["direct_bytes"]  # only the norms
    # weightlift's lines are in vLLM's log, with vLLM's format ("INFO ... [file.py:N] weightlift: ...").
    assert re.search(r"INFO .*\[_progress\.py:\d+\] weightlift: \d+ checkpoint files", ours.log), ours.log[-3000:]
    assert re.search(r"weightlift: .* read straight into parameters", ours.log)
    # The engine's own reasons for the loads it ran (its plan's log), not a prediction of them.
    assert re.search(r"\[_progress\.py:\d+\] weightlift: auto: stream \(the caller's memory", ours.log)
    assert re.search(r"\[_progress\.py:\d+\] weightlift: stream: \d+ threads, \d+ KiB reads", ours.log)
    # One progress bar over the files, as vLLM's: from 0/N to N/N, never back, at most a line per file
    # plus the first and the closing one (tqdm's rate limit may merge lines, for vLLM's bar too).
    bar, theirs = _bar(ours.log), _bar(ref.log)
    files = s["files"]
    assert bar[0] == (0, files) and bar[-1] == (files, files) and theirs[0] == (0, files)
    assert [n for n, _ in bar] == sorted(n for n, _ in bar) and len(bar) <= files + 2


def test_a_local_folder_equals_vllms_own_loader_tokens_and_logprobs(runs, model_bytes):
    """LLM(folder, load_format="weightlift") in vLLM's default process mode: greedy tokens and
    top-5 logprobs identical to load_format="auto"; every byte went one way or the other."""
    ref, ours = runs("auto-tp1"), runs("weightlift-tp1")
    _same_generation(ref, ours)
    assert len(ours.stats) == 1
    s = ours.stats[0]
    assert s["placements"] == s["confirmed"] > 0 and s["loose"] == 0 and s["materialized"] == 0
    assert s["direct_bytes"] + s["model_bytes"] == model_bytes


def test_weightlift_from_s3_equals_the_local_load(runs):
    ref, ours = runs("auto-tp1"), runs("weightlift-s3")
    _same_generation(ref, ours)
    s = ours.stats[0]
    assert s["placements"] == s["confirmed"] > 0 and s["materialized"] == 0
    assert re.search(r"weightlift: \d+ checkpoint files .* on S3", ours.log)


def test_weightlift_from_the_hub_loads_while_downloading(runs, hub_model, model):
    ref, ours = runs("auto-tp1"), runs("weightlift-hub")
    _same_generation(ref, ours)
    s = ours.stats[0]
    assert s["placements"] == s["confirmed"] > 0 and s["materialized"] == 0
    assert re.search(r"Loading org/tied-llama while it downloads \(\d+ files", ours.log), ours.log[-3000:]
    # The cache ends as a plain download leaves it: every weight file in the snapshot, bytes identical.
    _, _, cache = hub_model
    snapshots = list((cache / "models--org--tied-llama" / "snapshots").iterdir())
    assert len(snapshots) == 1
    index = json.loads((model / "model.safetensors.index.json").read_text())
    for name in set(index["weight_map"].values()):
        assert (snapshots[0] / name).read_bytes() == (model / name).read_bytes()


@pytest.mark.skipif(os.environ.get("WEIGHTLIFT_TEST_VLLM_TP2", "1") != "1",
                    reason="WEIGHTLIFT_TEST_VLLM_TP2=0: two engine starts with two workers each skipped")
def test_tensor_parallel_2_reads_the_checkpoint_once(runs, model_bytes):
    ref, ours = runs("auto-tp2"), runs("weightlift-tp2")
    _same_generation(ref, ours)
    assert sorted(s["tp_rank"] for s in ours.stats) == [0, 1]
    total = model_bytes
    for s in ours.stats:
        assert s["distributed"] and s["materialized"] == 0 and s["confirmed"] == s["placements"] > 0
    # Every rank's shards read by that rank alone, the replicated tensors read once and exchanged:
    # storage bytes across both ranks are the checkpoint's (headers and O_DIRECT rounding aside),
    # where each rank reading every file would be twice that.
    read = sum(s["bytes_read"] for s in ours.stats)
    assert 0.98 * total <= read <= 1.05 * total, (read, total)
    assert sum(s["bytes_exchanged"] for s in ours.stats) > 0
