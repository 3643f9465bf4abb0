"""A package's sdist from the package index, pinned by sha256 and kept in a cache.

Used by the runners of upstream test suites (safetensors_suite/run.py,
tests/vllm034/suite/run.py): the index's JSON simple API (PEP 691) names the
file's URL, the bytes are checked against the pinned hash before the archive
gets its final name (a failed download leaves no archive behind).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sdist_url(project: str, sdist: str, sha256: str) -> str:
    """The sdist's URL from the package index's JSON simple API (PEP 691)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    req = urllib.request.Request(f"{index}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    for f in files:
        if f["filename"] == sdist:
            if f.get("hashes", {}).get("sha256", sha256) != sha256:
                raise SystemExit(f"{sdist}: the index lists sha256 {f['hashes']['sha256']}, expected {sha256}")
            return f["url"]
    raise SystemExit(f"{sdist} is not on {index}")


def fetch_sdist(project: str, archive: Path, sha256: str, *, label: str, timeout: float) -> None:
    """Makes `archive` (named as the sdist) hold the pinned sdist: kept when its hash matches, else downloaded."""
    if archive.is_file() and sha256_of(archive) == sha256:
        return
    url = sdist_url(project, archive.name, sha256)
    print(f"{label}: downloading {url}", file=sys.stderr, flush=True)
    part = archive.with_name(archive.name + ".part")
    with urllib.request.urlopen(url, timeout=timeout) as r, open(part, "wb") as out:
        shutil.copyfileobj(r, out)
    got = sha256_of(part)
    if got != sha256:
        part.unlink()
        raise SystemExit(f"{archive.name} from {url}: sha256 {got}, expected {sha256}")
    part.rename(archive)
