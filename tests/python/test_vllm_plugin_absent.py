"""The vLLM plug-in entry point where vLLM is not installed (this venv): a
no-op, any number of times, that imports nothing of vLLM."""
from __future__ import annotations

import subprocess
import sys


def test_register_without_vllm_is_a_quiet_no_op():
    code = """
import sys, importlib.util
assert importlib.util.find_spec("vllm") is None, "this test wants a Python without vLLM"
from importlib.metadata import entry_points
eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "weightlift"]
assert len(eps) == 1, eps  # what vLLM would run in each of its processes
eps[0].load()(); eps[0].load()()
import weightlift.vllm_plugin as p
p.register()
assert not p.vllm_available() and not p._registered
assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), sorted(sys.modules)
assert "weightlift.vllm_plugin._loader" not in sys.modules
print("OK")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr
    assert r.stderr == ""
