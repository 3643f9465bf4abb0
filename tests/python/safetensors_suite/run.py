#!/usr/bin/env python3
"""Runs safetensors' own Python test suite against weightlift.safetensors, and
the same tests against the real safetensors package as the control.

The tests come from the safetensors 0.8.0 source distribution on PyPI
(safetensors-0.8.0.tar.gz: bindings/python/tests/ of the v0.8.0 release,
2026-06-09), downloaded at test time, verified against the SHA-256 below and
cached outside the checkout ($WEIGHTLIFT_CACHE or ~/.cache/weightlift/, keyed
by version and hash). Nothing of it is committed. (The sdist, pinned by its
hash, is the record of the release: the v0.8.0 tag's commit is not in the
copy of huggingface/safetensors we could read, whose main was 24b0b28,
0.8.0-dev.0, 2026-05-12; its tests differ from the sdist's only by one
MPS-only test the release added, and pass here as well: --source.)

Against weightlift, only the imports are rewritten (`safetensors` ->
`weightlift.safetensors`, `safetensors.torch` -> `weightlift.safetensors.torch`,
...); upstream_conftest.py (copied beside the tests as conftest.py) skips the
frameworks weightlift does not claim and the devices this machine lacks, with
the reason. The control runs the same files unchanged against the
safetensors installed in this Python (python/requirements-dev.txt pins 0.8.0).

  run.py                  both runs; exit status 1 when either has a failure
  run.py --source DIR     tests from a local copy of bindings/python/tests
                          (e.g. a newer safetensors checkout; local use only)
  run.py --only weightlift|safetensors   one of the two runs
  run.py -- -k slice      extra pytest arguments
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

VERSION = "0.8.0"
SDIST = f"safetensors-{VERSION}.tar.gz"
SHA256 = "fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d"
TESTS_IN_SDIST = f"safetensors-{VERSION}/bindings/python/tests/"
HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    root = os.environ.get("WEIGHTLIFT_CACHE") or os.path.join(Path.home(), ".cache", "weightlift")
    return Path(root) / "safetensors-suite" / f"{VERSION}-{SHA256[:16]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sdist_url() -> str:
    """The sdist's URL from the package index's JSON simple API (PEP 691)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    req = urllib.request.Request(f"{index}/safetensors/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    for f in files:
        if f["filename"] == SDIST:
            if f.get("hashes", {}).get("sha256", SHA256) != SHA256:
                raise SystemExit(f"{SDIST}: the index lists sha256 {f['hashes']['sha256']}, expected {SHA256}")
            return f["url"]
    raise SystemExit(f"{SDIST} is not on {index}")


def fetch_tests() -> Path:
    """bindings/python/tests of the sdist, extracted into the cache (once)."""
    cache = cache_dir()
    tests = cache / "tests"
    if (tests / "test_simple.py").is_file():
        return tests
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    if not archive.is_file() or _sha256(archive) != SHA256:
        url = _sdist_url()
        print(f"safetensors suite: downloading {url}", file=sys.stderr)
        part = cache / (SDIST + ".part")
        with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as out:
            shutil.copyfileobj(r, out)
        got = _sha256(part)
        if got != SHA256:
            part.unlink()
            raise SystemExit(f"{SDIST}: sha256 {got}, expected {SHA256}")
        part.rename(archive)
    staging = Path(tempfile.mkdtemp(dir=cache))
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(TESTS_IN_SDIST) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(TESTS_IN_SDIST):] or "."
        tar.extractall(staging, members=members)
    if tests.exists():
        shutil.rmtree(tests)
    staging.rename(tests)
    return tests


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


def run(dest: Path, target: str, extra: list[str]) -> dict:
    xml = dest / "results.xml"
    env = dict(os.environ, WL_SUITE_TARGET=target, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "tests", *extra]
    print(f"== safetensors {VERSION} suite against {target}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    rc = subprocess.call(cmd, cwd=dest, env=env)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.is_file():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["rc"] = rc
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, help="a local bindings/python/tests directory instead of the sdist's")
    ap.add_argument("--only", choices=("weightlift", "safetensors"))
    ap.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()
    src = a.source.resolve() if a.source else fetch_tests()
    origin = str(src) if a.source else f"{SDIST} (sha256 {SHA256[:12]}...)"
    work = Path(tempfile.mkdtemp(prefix="wl-st-suite-"))
    results = {}
    try:
        for target in ("weightlift", "safetensors"):
            if a.only and a.only != target:
                continue
            prepare(src, work / target, target)
            results[target] = run(work / target, target, a.pytest_args)
    finally:
        if a.keep:
            print(f"run directories kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"safetensors' own tests from {origin}:", file=sys.stderr)
    bad = False
    for target, c in results.items():
        who = "weightlift.safetensors" if target == "weightlift" else f"safetensors {_installed_version()}"
        print(f"  {who:24} {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
              f"{c['skipped']} skipped", file=sys.stderr)
        bad |= c["rc"] != 0 or c["failures"] > 0 or c["errors"] > 0 or c["tests"] == 0
    return 1 if bad else 0


def _installed_version() -> str:
    try:
        from importlib.metadata import version

        return version("safetensors")
    except Exception:
        return "(not installed)"


if __name__ == "__main__":
    sys.exit(main())
