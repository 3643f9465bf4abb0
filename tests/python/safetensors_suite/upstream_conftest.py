"""conftest.py for safetensors' own Python tests (copied beside them by run.py).

It edits no test: it skips, with the reason, what weightlift does not claim
or this machine cannot run, and in the weightlift run it refuses any import
of the real `safetensors` package (so a test that imported it without going
through the rewritten imports would fail, not pass against the wrong package).

  WL_SUITE_TARGET=weightlift | safetensors  (set by run.py)
"""
import importlib.abc
import os
import sys

import pytest

TARGET = os.environ.get("WL_SUITE_TARGET", "weightlift")

# Test files of frameworks weightlift does not claim: skipped whole (their
# module-level imports of tensorflow/jax/mlx/paddle are never run).
FRAMEWORK_FILES = {
    "test_tf_comparison.py": "TensorFlow",
    "test_flax_comparison.py": "Flax/JAX",
    "test_mlx_comparison.py": "MLX",
    "test_paddle_comparison.py": "Paddle",
}


def _has_cuda(n: int = 1) -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() >= n
    except Exception:
        return False


def _has_mps() -> bool:
    try:
        import torch

        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    except Exception:
        return False


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except Exception:
        return False


# Tests of a device, by name: (what the name contains, the device, is it here?).
DEVICE_TESTS = [
    ("device_1", "a second CUDA device", lambda: _has_cuda(2)),
    ("gpu", "CUDA", _has_cuda),
    ("anonymous_accelerator", "CUDA", _has_cuda),
    ("mps", "MPS (Apple)", _has_mps),
    ("npu", "an Ascend NPU (torch_npu)", lambda: _importable("torch_npu")),
    ("hpu", "an Intel Gaudi HPU", lambda: _importable("habana_frameworks.torch.core")),
    ("xpu", "an Intel XPU", lambda: False),
]


class _SkippedFile(pytest.File):
    def __init__(self, *, reason: str, **kw):
        super().__init__(**kw)
        self.reason = reason

    def collect(self):
        yield _SkippedItem.from_parent(self, name=self.path.stem, reason=self.reason)


class _SkippedItem(pytest.Item):
    def __init__(self, *, reason: str, **kw):
        super().__init__(**kw)
        self.add_marker(pytest.mark.skip(reason=reason))

    def runtest(self):  # pragma: no cover - always skipped
        pass

    def reportinfo(self):
        return self.path, 0, self.name


def pytest_pycollect_makemodule(module_path, parent):
    framework = FRAMEWORK_FILES.get(module_path.name)
    if framework is None:
        return None
    why = ("weightlift does not claim this framework" if TARGET == "weightlift"
           else "not part of the torch/numpy comparison run")
    return _SkippedFile.from_parent(parent, path=module_path, reason=f"{framework}: {why}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.name.lower()
        for key, device, present in DEVICE_TESTS:
            if key in name and not present():
                item.add_marker(pytest.mark.skip(reason=f"needs {device}, which this machine lacks"))
                break


class _NoRealSafetensors(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "safetensors" or fullname.startswith("safetensors."):
            raise ImportError(f"{fullname}: the weightlift run must not import the real safetensors package")
        return None


if TARGET == "weightlift":
    for _m in [m for m in sys.modules if m == "safetensors" or m.startswith("safetensors.")]:
        del sys.modules[_m]
    sys.meta_path.insert(0, _NoRealSafetensors())
