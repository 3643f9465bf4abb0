import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = os.environ.get("WEIGHTLIFT_CLI", str(ROOT / "build" / "bin" / "weightlift"))


def run_cli(*args, check=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"weightlift {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}")
    return r


@pytest.fixture(scope="session")
def cli():
    return run_cli
