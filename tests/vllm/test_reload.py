"""Every caller of the loader after the model's first load_weights, in real
vLLM (default process mode): reload_weights to another checkpoint and back,
and EPLB's redistribution path (a fresh loader's get_all_weights, filtered
to one decoder layer, that layer reloaded layerwise, as vLLM 0.34's
reload_experts_from_disk does). After each step every parameter and buffer
of `--load-format weightlift` is byte-identical to `auto`'s after the same
step, and so are the greedy tokens and top-5 logprobs (vLLM's CPU linear
layers keep their weights packed for oneDNN, outside the parameters, which
then hold nothing: the generation covers them); the plug-in wrote into
parameters only during the first load."""
from __future__ import annotations

import hashlib

from conftest import FILTERED_MODULE

EMPTY = hashlib.sha256(b"").hexdigest()


def _steps(run):
    """[(hashes, generation)] after the first load (its generation: the run's own), to B, back to A, filtered."""
    after = run.result["after"]
    hashes = [h for h in after if isinstance(h, dict) and "tokens" not in h]
    gens = [run.result] + [g for g in after if isinstance(g, dict) and "tokens" in g]
    assert len(hashes) == len(gens) == 4, after
    return list(zip(hashes, [{"tokens": g["tokens"], "logprobs": g["logprobs"]} for g in gens]))


def test_each_step_leaves_the_parameters_and_the_generation_auto_leaves(runs):
    ref, ours = _steps(runs("auto-tp1")), _steps(runs("weightlift-tp1"))
    for i, ((rh, rg), (oh, og)) in enumerate(zip(ref, ours)):
        assert rh.keys() == oh.keys()
        differ = sorted(n for n in rh if rh[n] != oh[n])
        assert not differ, f"step {i}: {len(differ)} tensors differ from auto's, e.g. {differ[:5]}"
        assert og == rg, f"step {i}: the generation differs from auto's"


def test_the_steps_change_what_they_should(runs):
    (first, g_first), (to_b, g_b), (back, g_back), (filtered, g_filtered) = _steps(runs("weightlift-tp1"))
    # The checkpoint's tensors the parameters still hold (not the attention's constant scales).
    held = [n for n in first if first[n] != EMPTY and n.endswith((".weight", ".bias"))]
    assert any("embed" in n for n in held) and any("norm" in n for n in held)
    # reload_weights to B changes every weight; back to A restores the first load exactly.
    assert all(first[n] != to_b[n] for n in held), [n for n in held if first[n] == to_b[n]]
    assert g_b != g_first
    assert back == first and g_back == g_first
    # EPLB's filtered stream from B: the kept layer is B's, everything else A's as it was
    # (before, the plug-in wrote every matching parameter before yielding: A's embeddings
    # would have been B's).
    inside = [n for n in held if n.startswith(FILTERED_MODULE + ".")]
    assert inside
    for n in first:
        assert filtered[n] == (to_b[n] if n in inside else back[n]), n
    assert g_filtered not in (g_first, g_b)  # one layer of B: neither model


def test_only_the_first_load_wrote_into_parameters(runs, model_bytes):
    ours = runs("weightlift-tp1")
    assert len(ours.stats) == 1 and ours.stats[0]["placements"] > 0
    # Three plain streams: the two reloads, whole; EPLB's, whole too (the caller filters).
    assert [s["caller"] for s in ours.streams] == ["stream"] * 3
    for s in ours.streams:
        assert s["model_bytes"] == model_bytes and "placements" not in s
    assert [a for a in ours.result["after"] if isinstance(a, int)][0] > 0  # tensors the filtered caller kept
    assert ours.log.count("as a plain stream (not the model's first load_weights") == 3
