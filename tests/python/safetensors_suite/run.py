#!/usr/bin/env python3
"""Runs safetensors' own Python test suites against weightlift.safetensors,
and the same tests against the real safetensors package of that release as
the control, for each release weightlift.safetensors follows:

  0.8.0     safetensors-0.8.0.tar.gz (bindings/python/tests/ of the v0.8.0
            release, 2026-06-09). The v0.8.0 tag's commit is not in the copy
            of huggingface/safetensors we could read (main at 24b0b28,
            0.8.0-dev.0, 2026-05-12; its tests differ from the sdist's only by
            one MPS-only test the release added, and pass here as well:
            --source). Control: safetensors 0.8.0, the one .venv pins.
  0.9.0rc1  safetensors-0.9.0rc1.tar.gz (uploaded 2026-09-24; the release's
            commit is not in the copy of safetensors/safetensors we could read
            either, whose newest tag is v0.8.0-rc.0; `prefetch` is that
            repository's pull requests #827 and #848). Its tests are 0.8's
            plus `prefetch` and `get_tensor_meta` in test_pread_backend.py.
            Control: safetensors 0.9.0rc1's wheel, installed (pinned by hash)
            into a folder of the cache that only the control run sees.

The sdists come from PyPI at test time, verified against the SHA-256 below
and cached outside the checkout ($WEIGHTLIFT_CACHE or ~/.cache/weightlift/,
keyed by version and hash); nothing of them is committed.

Against weightlift only the imports are rewritten (`safetensors` ->
`weightlift.safetensors`, `safetensors.torch` -> `weightlift.safetensors.torch`,
...); upstream_conftest.py (copied beside the tests as conftest.py) skips the
frameworks weightlift does not claim and the devices this machine lacks, with
the reason, and in that run refuses any import of the real package. The
control runs the same files unchanged. A release passes when neither run has
a failure or an error and both count the same tests passed and skipped.

  run.py                      every release, both runs; exit status 1 when any fails
  run.py --versions 0.9.0rc1  one release
  run.py --source DIR         tests from a local copy of bindings/python/tests
                              (one release, e.g. a safetensors checkout; local use only)
  run.py --only weightlift|safetensors   one of the two runs
  run.py -- -k slice          extra pytest arguments
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from pinned_sdist import fetch_sdist  # noqa: E402  (tests/python)

# version -> the sdist's SHA-256, and the control's wheels (x86-64 and arm64
# Linux) by SHA-256 when the control is not the package this Python has.
RELEASES = {
    "0.8.0": {
        "sdist_sha256": "fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d",
        "wheel_sha256": ["fd6f3f93c9a0a7cc2788ee63fb763353d4bd2e89b0751bc78fcf7dda00bea774",
                         "7a46e5ff292c356d6991e60942ba7f79817682d3a2cef0702136448cb9c4d235"],
    },
    "0.9.0rc1": {
        "sdist_sha256": "8a70d139a45d71557e116339f5115afe88af2d80b08701c31ce0478d5bfc8d93",
        "wheel_sha256": ["d5109939a6f11d502c1656c927e3b9413f8d48dba635204c2f21cdc465e5035a",
                         "42ceb615421423257a6cce3de3a8862f2f094af0beec282838c18102db51eb4d"],
    },
}


def cache_dir(version: str) -> Path:
    root = os.environ.get("WEIGHTLIFT_CACHE") or os.path.join(Path.home(), ".cache", "weightlift")
    return Path(root) / "safetensors-suite" / f"{version}-{RELEASES[version]['sdist_sha256'][:16]}"


def fetch_tests(version: str) -> Path:
    """bindings/python/tests of the release's sdist, extracted into the cache (once)."""
    cache, sha256 = cache_dir(version), RELEASES[version]["sdist_sha256"]
    sdist = f"safetensors-{version}.tar.gz"
    tests = cache / "tests"
    if (tests / "test_simple.py").is_file():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / sdist
    fetch_sdist("safetensors", archive, sha256, label="safetensors suite", timeout=120)
    prefix = f"safetensors-{version}/bindings/python/tests/"
    staging = Path(tempfile.mkdtemp(dir=cache))
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(prefix):] or "."
        tar.extractall(staging, members=members)
    if tests.exists():
        shutil.rmtree(tests)
    staging.rename(tests)
    return tests


def installed_version(pythonpath: str | None = None) -> str:
    """The version of the safetensors this Python imports (with `pythonpath` first), or ""."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # The distribution's version (0.9.0rc1's module says "0.9.0-rc.1", its Cargo version).
    r = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('safetensors'))"],
                       env=env, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def control_path(version: str) -> str | None:
    """Where the control run finds safetensors `version`: None for this Python's
    own when it is that release, else a folder of the cache holding that
    release's wheel (pip, pinned by hash; installed once)."""
    if installed_version() == version:
        return None
    site = cache_dir(version) / "control"
    if installed_version(str(site)) == version:
        return str(site)
    req = cache_dir(version) / "control-requirements.txt"
    req.parent.mkdir(parents=True, exist_ok=True)
    hashes = " ".join(f"--hash=sha256:{h}" for h in RELEASES[version]["wheel_sha256"])
    req.write_text(f"safetensors=={version} {hashes}\n")
    staging = Path(tempfile.mkdtemp(dir=req.parent))
    print(f"safetensors suite: installing safetensors {version} for the control run", file=sys.stderr)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary", ":all:",
                           "--require-hashes", "--target", str(staging), "-r", str(req)])
    if site.exists():
        shutil.rmtree(site)
    staging.rename(site)
    if installed_version(str(site)) != version:
        raise SystemExit(f"safetensors {version}: {site} does not import as that release")
    return str(site)


_FROM = re.compile(r"^(\s*)from\s+safetensors(?=[\s.])", re.M)
_IMPORT = re.compile(r"^(\s*)import\s+safetensors((?:\.\w+)*)(\s+as\s+\w+)?\s*$", re.M)


def rewrite_imports(source: str) -> str:
    """`safetensors` -> `weightlift.safetensors` in import statements, nothing else."""
    source = _FROM.sub(r"\1from weightlift.safetensors", source)

    def imp(m):
        indent, sub, alias = m.group(1), m.group(2) or "", m.group(3)
        if alias:
            return f"{indent}import weightlift.safetensors{sub}{alias}"
        line = f"{indent}import weightlift.safetensors as safetensors"
        return f"{indent}import weightlift.safetensors{sub}; {line.strip()}" if sub else line

    return _IMPORT.sub(imp, source)


def prepare(src: Path, dest: Path, target: str) -> None:
    """A run directory: dest/tests/ (the tests, their imports rewritten for
    weightlift) beside which the tests write their files (they use ./tests/data/)."""
    shutil.copytree(src, dest / "tests")
    if target == "weightlift":
        for py in (dest / "tests").rglob("*.py"):
            py.write_text(rewrite_imports(py.read_text()))
    shutil.copy(HERE / "upstream_conftest.py", dest / "tests" / "conftest.py")


def run(dest: Path, version: str, target: str, pythonpath: str | None, extra: list[str]) -> dict:
    xml = dest / "results.xml"
    env = dict(os.environ, WL_SUITE_TARGET=target, PYTHONDONTWRITEBYTECODE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "tests", *extra]
    print(f"== safetensors {version} suite against {target}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    rc = subprocess.call(cmd, cwd=dest, env=env)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.is_file():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["rc"] = rc
    return counts


def run_release(version: str, source: Path | None, only: str | None, keep: bool, extra: list[str]) -> bool:
    """Both runs of one release; True when they pass and agree."""
    src = source if source else fetch_tests(version)
    origin = str(src) if source else \
        f"safetensors-{version}.tar.gz (sha256 {RELEASES[version]['sdist_sha256'][:12]}...)"
    work = Path(tempfile.mkdtemp(prefix=f"wl-st-suite-{version}-"))
    results = {}
    try:
        for target in ("weightlift", "safetensors"):
            if only and only != target:
                continue
            pythonpath = control_path(version) if target == "safetensors" else None
            prepare(src, work / target, target)
            results[target] = run(work / target, version, target, pythonpath, extra)
    finally:
        if keep:
            print(f"run directories kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"safetensors {version}'s own tests from {origin}:", file=sys.stderr)
    ok = True
    for target, c in results.items():
        who = "weightlift.safetensors" if target == "weightlift" else f"safetensors {version}"
        print(f"  {who:24} {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
              f"{c['skipped']} skipped", file=sys.stderr)
        ok &= c["rc"] == 0 and c["failures"] == 0 and c["errors"] == 0 and c["tests"] > 0
    if len(results) == 2:
        a, b = results["weightlift"], results["safetensors"]
        if (a["passed"], a["skipped"]) != (b["passed"], b["skipped"]):
            print(f"  the counts differ: weightlift.safetensors {a['passed']} passed / {a['skipped']} skipped, "
                  f"safetensors {version} {b['passed']} / {b['skipped']}", file=sys.stderr)
            ok = False
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default=",".join(RELEASES), help="comma-separated: " + ", ".join(RELEASES))
    ap.add_argument("--source", type=Path, help="a local bindings/python/tests directory instead of the sdist's")
    ap.add_argument("--only", choices=("weightlift", "safetensors"))
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()
    versions = [v for v in a.versions.split(",") if v]
    unknown = [v for v in versions if v not in RELEASES]
    if unknown:
        ap.error(f"unknown release {', '.join(unknown)} (known: {', '.join(RELEASES)})")
    if a.source and len(versions) != 1:
        ap.error("--source runs one release: name it with --versions")
    ok = True
    for version in versions:
        ok &= run_release(version, a.source.resolve() if a.source else None, a.only, a.keep, a.pytest_args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
