"""What the wheel tests share: which wheels, their tags, a Python to install
each into, the venv it is installed in.

    WEIGHTLIFT_WHEELS  the wheels to test (os.pathsep-separated); default dist/weightlift-<version>-*.whl
    WEIGHTLIFT_CLI     the build tree's CLI, the reference (default build/bin/weightlift)
"""
import glob
import os
import pathlib
import re
import shutil
import subprocess

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
CLI = os.environ.get("WEIGHTLIFT_CLI", str(ROOT / "build" / "bin" / "weightlift"))


def wheels():
    env = os.environ.get("WEIGHTLIFT_WHEELS")
    found = env.split(os.pathsep) if env else sorted(glob.glob(str(ROOT / "dist" / f"weightlift-{VERSION}-*.whl")))
    return [pathlib.Path(w) for w in found if w]


WHEELS = wheels()


def wheel_id(w):
    return re.sub(r"^weightlift-[^-]+-|\.whl$", "", w.name)


def wheel_tags(w):
    """(python tag, abi tag, platform tag) of a wheel's file name."""
    py, abi, plat = w.name[: -len(".whl")].split("-")[-3:]
    return py, abi, plat


def interpreter_for(w):
    """A Python that can install wheel `w`: Debian's own for its cp3X (it sees Debian's torch), else any found."""
    py, abi, _ = wheel_tags(w)
    major_minor = (int(py[2]), int(py[3:]))
    candidates = [f"/usr/bin/python{major_minor[0]}.{major_minor[1]}", f"python{major_minor[0]}.{major_minor[1]}"]
    if abi == "abi3":
        candidates += [f"python3.{m}" for m in range(major_minor[1], 20)]
        candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    for c in candidates:
        p = shutil.which(c) or (c if os.access(c, os.X_OK) else None)
        if not p:
            continue
        v = subprocess.run([p, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
        if v.returncode != 0:
            continue
        ver = tuple(map(int, v.stdout.split()))
        if ver == major_minor or (abi == "abi3" and ver >= major_minor):
            return p
    return None


class Venv:
    def __init__(self, path, wheel, install_seconds, install_log):
        self.path, self.wheel = path, wheel
        self.python = str(path / "bin" / "python")
        self.weightlift = str(path / "bin" / "weightlift")
        self.install_seconds, self.install_log = install_seconds, install_log

    def run(self, *args, check=True, **kw):
        r = subprocess.run([*map(str, args)], capture_output=True, text=True, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def site_package(self):
        code = "import importlib.util as u; print(u.find_spec('weightlift').submodule_search_locations[0])"
        out = self.run(self.python, "-c", code)
        return pathlib.Path(out.stdout.strip())
