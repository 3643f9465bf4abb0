"""Fixtures of the wheel tests: the wheels scripts/wheel built, a fresh venv per
wheel with only that wheel installed, and a synthesized model with the build
tree's checksums as the reference (see wheels.py for the variables)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from wheels import CLI, WHEELS, Venv, interpreter_for, wheel_id


@pytest.fixture(scope="module", params=WHEELS, ids=wheel_id)
def wheel(request):
    return request.param


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv (Debian's Python sees Debian's torch and numpy through
    --system-site-packages; nothing of weightlift's) with only this wheel
    installed, by pip, from the file, with no index and binaries only: no
    build step can run."""
    py = interpreter_for(wheel)
    if py is None:
        pytest.skip(f"no Python here can install {wheel.name}")
    path = tmp_path_factory.mktemp("venv-" + wheel_id(wheel))
    subprocess.run([py, "-m", "venv", "--system-site-packages", str(path)], check=True)
    # The runtime dependencies (tqdm, filelock: pure Python) as this test's own
    # environment has them, on a path of their own: the venv stays offline.
    deps = path / "deps"
    deps.mkdir()
    for mod in ("tqdm", "filelock"):
        m = __import__(mod)
        shutil.copytree(pathlib.Path(m.__file__).parent, deps / mod)
    py = str(path / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (pathlib.Path(site) / "weightlift-test-deps.pth").write_text(str(deps) + "\n")
    t0 = time.monotonic()
    r = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--only-binary",
                        ":all:", "--disable-pip-version-check", "-v", str(wheel)], capture_output=True, text=True)
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"\n{wheel.name}: pip install --no-deps took {seconds:.1f} s", file=sys.stderr)
    return Venv(path, wheel, seconds, r.stdout + r.stderr)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A synthesized model (two shards, several dtypes) and the build tree's own checksums of it."""
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"no build-tree CLI at {CLI} (scripts/build, or set WEIGHTLIFT_CLI)")
    d = tmp_path_factory.mktemp("model") / "m"
    subprocess.run([CLI, "synth", str(d), "--size", "TINY", "--shards", "2"], check=True, capture_output=True)
    ref = subprocess.run([CLI, "load", str(d), "--checksum", "--format", "jsonl", "--no-progress"],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in ref.splitlines()]
    assert rows
    return {"dir": d, "jsonl": ref, "sha256": {r["name"]: r["sha256"] for r in rows}}
