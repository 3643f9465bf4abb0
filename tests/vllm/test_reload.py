"""Every caller of the loader after the model's first load_weights, in real
vLLM (default process mode): reload_weights to another checkpoint and back,
and EPLB's redistribution path (a fresh loader's get_all_weights, filtered
to one decoder layer, that layer reloaded layerwise, as vLLM 0.34's
reload_experts_from_disk does). After each step every parameter and buffer
of `--load-format weightlift` is byte-identical to `auto`'s after the same
step; the plug-in wrote into parameters only during the first load."""
from __future__ import annotations

from conftest import FILTERED_MODULE


def _steps(run) -> list[dict]:
    hashes = [h for h in run.result["after"] if isinstance(h, dict)]
    assert len(hashes) == 4, run.result["after"]
    return hashes


def test_each_step_leaves_the_parameters_auto_leaves(runs):
    ref, ours = _steps(runs("auto-tp1")), _steps(runs("weightlift-tp1"))
    for i, (r, o) in enumerate(zip(ref, ours)):
        assert r.keys() == o.keys()
        differ = sorted(n for n in r if r[n] != o[n])
        assert not differ, f"step {i}: {len(differ)} tensors differ from auto's, e.g. {differ[:5]}"


def test_the_steps_change_what_they_should(runs):
    first, to_b, back_to_a, filtered = _steps(runs("weightlift-tp1"))
    weights = [n for n in first if "rotary" not in n]
    # reload_weights to B changes the weights; back to A restores the first load exactly.
    assert sum(first[n] != to_b[n] for n in weights) > 0.9 * len(weights)
    assert back_to_a == first
    # EPLB's filtered stream from B: the kept layer is B's, everything else A's as it was
    # (the old plug-in wrote every matching parameter before yielding: A's layers would be B's).
    inside = [n for n in first if n.startswith(FILTERED_MODULE + ".")]
    assert inside
    for n in first:
        want = to_b[n] if n in inside else back_to_a[n]
        assert filtered[n] == want, n


def test_only_the_first_load_wrote_into_parameters(runs, model_bytes):
    ours = runs("weightlift-tp1")
    assert len(ours.stats) == 1 and ours.stats[0]["placements"] > 0
    # Three plain streams: the two reloads, whole; EPLB's, whole too (the caller filters).
    assert [s["caller"] for s in ours.streams] == ["stream"] * 3
    for s in ours.streams:
        assert s["model_bytes"] == model_bytes and "placements" not in s
    assert ours.result["after"][5] > 0  # tensors the filtered caller kept
    assert ours.log.count("as a plain stream (not the model's first load_weights") == 3
