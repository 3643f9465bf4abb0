#!/usr/bin/env python3
"""Runs vLLM 0.34's own weight_utils / model_loader tests against
weightlift.vllm_compat and weightlift.ep_weight_filter, and the same tests
against vLLM 0.34 itself as the control. Run it with the Python of the vLLM
0.34 venv (scripts/vllm-venv --reqs tests/vllm034/requirements.txt), which
has vLLM 0.34.0 and weightlift installed.

The tests come from vLLM's source distribution on PyPI (vllm-0.34.0.tar.gz,
the tests/ of the v0.34.0 release), downloaded at test time, verified
against the SHA-256 below and cached outside the checkout ($WEIGHTLIFT_CACHE
or ~/.cache/weightlift/, keyed by version and hash); only its tests/**/*.py
are kept there. Nothing of it is committed.

Against weightlift, only module paths are rewritten, in imports and in the
patch targets of monkeypatch/mock.patch strings:
  vllm.model_executor.model_loader.weight_utils     -> weightlift.vllm_compat
  vllm.model_executor.model_loader.ep_weight_filter -> weightlift.ep_weight_filter
  from vllm.model_executor.model_loader import weight_utils -> from weightlift import vllm_compat as weight_utils
Everything else a test uses (vLLM's configs, layers, loaders, reload
machinery) is vLLM's own in both runs. vLLM's tests/conftest.py (engine
runners, HF runners, media assets) is replaced by upstream_conftest.py of
this folder: the fixtures these files use, and the skips (both runs alike,
each with its reason) of what this machine lacks.

The two runs must have the same outcome for every test (so the same
passed/skipped counts, file by file), and no failure; the exit status is 1
otherwise.

  run.py                  both runs
  run.py --only weightlift|vllm   one of the two (no comparison)
  run.py --keep           keep the run directories (printed)
  run.py --touched        also count the weightlift run's tests that ran
                          weightlift's code (a profile hook: slower)
  run.py -- -k sink       extra pytest arguments (both runs)
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

VERSION = "0.34.0"
SDIST = f"vllm-{VERSION}.tar.gz"
SHA256 = "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
TOP = f"vllm-{VERSION}/"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
from pinned_sdist import fetch_sdist  # noqa: E402  (tests/python)

# The tests run, as pytest node ids under the sdist's tests/: vLLM 0.34's
# tests of weight_utils and ep_weight_filter (whole files), the reload tests
# whose toy models load through weight_utils' loaders (whole files), and
# from wider files the tests that call a weight_utils name. docs/vllm.md
# lists what is left out and why (engines, GPUs, the Hub, vLLM-only code).
_LOADER = "model_executor/model_loader/"
_RELOAD = [  # test_reload.py's tests whose code calls a weight_utils name
    "test_attention_sink_model_loading_shards_once",
    "test_attention_sink_deepseek_hy_loading_uses_parameter_loader",
    "test_gpt_oss_attention_sink_uses_parameter_loader",
    "test_attention_sink_layerwise_reload",
    "test_attention_reload_defers_post_load",
    "test_attention_first_load_processes_weights",
    "test_marlin_post_load_does_not_own_workspace",
    "test_get_numel_loaded_caps_at_param_size",
    "test_layerwise_reload_composed_loader_does_not_drop_params",
    "test_online_processing_waits_for_late_registered_bias",
    "test_hpc_rope_norm_kernel_sees_refit_norm_weights",
    "test_reload_weights_with_lora_moe",
    "test_finalize_runs_every_module_hook_after_its_submodules",
    "test_attention_post_load_reads_normalized_transform",
    "TestModelHookOnSplitLoad",
]
_ONLINE = [  # quantization/test_online.py's tests of weight_utils.get_quant_config (CPU, local config.json)
    "test_legacy_fp8_online_quantization_uses_per_tensor_shorthand",
    "test_online_activation_only_spec_raises",
    "test_activation_only_override_applies_to_checkpoint_method",
    "test_online_overlay_requires_normalized_quantization_config",
    "test_online_overlay_loads_checkpoint_config_file",
    "test_online_shorthand_selects_checkpoint_or_online_config",
]
SELECTED = [
    "model_executor/test_weight_utils.py",
    _LOADER + "test_ep_weight_filter.py",
    _LOADER + "test_filter_duplicate_safetensors.py",
    _LOADER + "test_mm_encoder_only_weight_filter.py",
    _LOADER + "fastsafetensors_loader/test_weight_utils.py",
    _LOADER + "instanttensor_loader/test_weight_utils.py",
    _LOADER + "runai_streamer_loader/test_weight_utils.py",
    _LOADER + "test_reload_lifecycle.py",
    _LOADER + "test_load_plan.py",
    _LOADER + "test_direct_reload.py",
    _LOADER + "test_reload_moe_kernels.py",
    *[f"{_LOADER}test_reload.py::{t}" for t in _RELOAD],
    "model_executor/test_eagle_quantization.py::test_maybe_remap_kv_scale_name",
    *[f"quantization/test_online.py::{t}" for t in _ONLINE],
]

# Module paths (dotted, in imports and patch-target strings) and the
# `from vllm.model_executor.model_loader import X` forms.
_MODULES = {
    "vllm.model_executor.model_loader.weight_utils": "weightlift.vllm_compat",
    "vllm.model_executor.model_loader.ep_weight_filter": "weightlift.ep_weight_filter",
}
_DOTTED = re.compile(r"\bvllm\.model_executor\.model_loader\.(weight_utils|ep_weight_filter)\b")
_FROM_PACKAGE = re.compile(
    r"^(\s*)from\s+vllm\.model_executor\.model_loader\s+import\s+(weight_utils|ep_weight_filter)\s*$", re.M)
_NEW_NAME = {"weight_utils": "vllm_compat", "ep_weight_filter": "ep_weight_filter"}


def cache_dir() -> Path:
    root = os.environ.get("WEIGHTLIFT_CACHE") or os.path.join(Path.home(), ".cache", "weightlift")
    return Path(root) / "vllm-suite" / f"{VERSION}-{SHA256[:16]}"


def fetch_tests() -> Path:
    """The sdist's tests/**/*.py, extracted into the cache once."""
    cache = cache_dir()
    tests = cache / "tests"
    if (tests / ".complete").is_file():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    fetch_sdist("vllm", archive, SHA256, label="vLLM suite", timeout=300)
    staging = Path(tempfile.mkdtemp(dir=cache))
    prefix = TOP + "tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(prefix) and m.isfile() and m.name.endswith(".py")]
        for m in members:
            m.name = m.name[len(prefix):]
            if m.name.startswith("/") or ".." in m.name.split("/"):
                raise SystemExit(f"{SDIST}: member {m.name!r} leaves the tests folder")
        # Regular files under relative names only (Pythons before 3.11.4 have no extraction filter).
        tar.extractall(staging, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    missing = [s for s in SELECTED if not (staging / s.split("::")[0]).is_file()]
    if missing:
        shutil.rmtree(staging)
        raise SystemExit(f"{SDIST}: no {', '.join(missing)} under tests/")
    (staging / ".complete").write_text(f"{SDIST} sha256 {SHA256}\n")
    if tests.exists():
        shutil.rmtree(tests)
    staging.rename(tests)
    return tests


def rewrite_imports(source: str) -> tuple[str, int]:
    """vLLM's weight_utils/ep_weight_filter module paths -> weightlift's, in
    imports and patch-target strings; nothing else. Returns (text, count)."""
    source, n1 = _FROM_PACKAGE.subn(lambda m: f"{m[1]}from weightlift import {_NEW_NAME[m[2]]} as {m[2]}", source)
    source, n2 = _DOTTED.subn(lambda m: _MODULES[m[0]], source)
    return source, n1 + n2


def _leftover(source: str) -> list[str]:
    """Lines that still name vLLM's weight_utils/ep_weight_filter (a form the
    rewrite does not know: the weightlift run would test vLLM)."""
    pat = re.compile(r"model_loader\b.*\b(weight_utils|ep_weight_filter)\b")
    return [line.strip() for line in source.splitlines() if pat.search(line) and "weightlift" not in line]


def prepare(src: Path, dest: Path, target: str) -> None:
    """dest/tests: the selected test files and the sdist's helper modules
    (every .py not named test_*), imports rewritten for weightlift in all of
    them; upstream_conftest.py as conftest.py in place of vLLM's."""
    selected = {s.split("::")[0] for s in SELECTED}

    def skip(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(src)
        return {n for n in names if n == ".complete" or (
            n.startswith("test_") and n.endswith(".py") and (rel / n).as_posix() not in selected)}

    shutil.copytree(src, dest / "tests", ignore=skip)
    if target == "weightlift":
        for py in (dest / "tests").rglob("*.py"):
            rel = py.relative_to(dest / "tests").as_posix()
            text, n = rewrite_imports(py.read_text())
            left = _leftover(text)
            if rel in selected and left:
                raise SystemExit(f"{rel}: vLLM's module still named after the rewrite: {left}")
            if n:
                py.write_text(text)
    shutil.copy(HERE / "upstream_conftest.py", dest / "tests" / "conftest.py")


def run(dest: Path, target: str, extra: list[str], touched: bool = False) -> dict:
    xml = dest / "results.xml"
    env = dict(os.environ, WL_SUITE_TARGET=target, PYTHONDONTWRITEBYTECODE="1")
    env.pop("WL_SUITE_TOUCHED", None)
    if touched:
        env["WL_SUITE_TOUCHED"] = str(dest / "touched.txt")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
           *[f"tests/{s}" for s in SELECTED], *extra]
    print(f"== vLLM {VERSION}'s tests against {target}", file=sys.stderr, flush=True)
    rc = subprocess.call(cmd, cwd=dest, env=env)
    result = {"rc": rc, **_counts(xml)}
    if touched:
        lines = (dest / "touched.txt").read_text().split() if (dest / "touched.txt").is_file() else []
        result["touched"] = dict(collections.Counter(n.split("::")[0].removeprefix("tests/") for n in lines))
    return result


def _counts(xml: Path) -> dict:
    """Totals, per-file counts and each test's outcome from pytest's JUnit XML."""
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    outcomes: dict[str, str] = {}
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
            per_file[_file_of(case)][outcome] += 1
            outcomes[f"{case.get('classname')}::{case.get('name')}"] = outcome
    total = collections.Counter()
    for c in per_file.values():
        total.update(c)
    return {"passed": total["passed"], "skipped": total["skipped"], "failed": total["failed"],
            "files": {k: dict(v) for k, v in sorted(per_file.items())}, "outcomes": outcomes}


def _file_of(case: ET.Element) -> str:
    """tests/x/y/test_z.py from a testcase's classname (tests.x.y.test_z[.Class])."""
    parts = case.get("classname", "").split(".")
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[1:i]) + ".py"
    return case.get("classname", "?")


def report(results: dict) -> bool:
    """Prints both runs' counts; True when they agree and nothing failed."""
    print(f"vLLM {VERSION}'s own tests ({SDIST}, sha256 {SHA256[:12]}...):", file=sys.stderr)
    names = {"weightlift": "weightlift.vllm_compat", "vllm": f"vLLM {_installed_version()}"}
    files = sorted({f for r in results.values() for f in r["files"]})
    for f in files:
        row = "  ".join(f"{t}: {_fmt(r['files'].get(f, {}))}" for t, r in results.items())
        if "touched" in results.get("weightlift", {}):
            row += f"  ({results['weightlift']['touched'].get(f, 0)} ran weightlift's code)"
        print(f"  {f}\n      {row}", file=sys.stderr)
    for target, r in results.items():
        print(f"  {names[target]:24} {r['passed']} passed, {r['skipped']} skipped, {r['failed']} failed",
              file=sys.stderr)
    ok = all(r["rc"] == 0 and r["failed"] == 0 and r["passed"] > 0 for r in results.values())
    if len(results) == 2:
        a, b = results["weightlift"]["outcomes"], results["vllm"]["outcomes"]
        differ = sorted(t for t in a.keys() | b.keys() if a.get(t) != b.get(t))
        for t in differ:
            print(f"  differs: {t}: weightlift {a.get(t, 'not run')}, vLLM {b.get(t, 'not run')}", file=sys.stderr)
        if differ:
            print(f"  the two runs differ in {len(differ)} tests", file=sys.stderr)
            ok = False
    return ok


def _fmt(c: dict) -> str:
    return f"{c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped, {c.get('failed', 0)} failed"


def _installed_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:
        return "(not installed)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("weightlift", "vllm"))
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("--touched", action="store_true",
                    help="count the weightlift run's tests that ran weightlift's code (slower)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()
    src = fetch_tests()
    work = Path(tempfile.mkdtemp(prefix="wl-vllm-suite-"))
    results = {}
    try:
        for target in ("weightlift", "vllm"):
            if a.only and a.only != target:
                continue
            prepare(src, work / target, target)
            results[target] = run(work / target, target, a.pytest_args, a.touched and target == "weightlift")
    finally:
        if a.keep:
            print(f"run directories kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
