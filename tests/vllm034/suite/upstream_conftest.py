"""conftest.py for vLLM 0.34's own tests (copied by run.py over vLLM's
tests/conftest.py, the same file in both runs).

vLLM's conftest.py sets up engine and HuggingFace runners, media assets, a
local asset server, GPU-memory cleanup and a global cleanup after every test
(gc and device caches: 0.8 s a test here, which the selected tests do not
need; dist_init cleans up after itself); it also imports tblib, PIL and the
test-model registry. This one keeps only the fixtures the selected tests
use, as vLLM defines them (default_vllm_config, dist_init, disable_log_dedup; the first two with a
VllmConfig whose device is "cpu", which vLLM's CUDA build cannot infer
without a GPU, and gloo), and adds the skips, each with its reason, of what
this machine lacks, the same in both runs:

  * tests that download a model from the Hugging Face Hub, when the Hub is
    not reachable (CI reaches only PyPI and Debian's mirrors);
  * tests of vLLM's calls into the instanttensor and runai-model-streamer
    packages (they mock the package and assert the arguments vLLM passes
    it): neither package is installed here (tests/vllm034/requirements.txt)
    and weightlift's iterators of those names do not use them.

and, without a GPU, tests/quantization/utils.py's is_quant_method_supported()
says False as it does on vLLM's CPU platform (it asserts a device capability
otherwise, which fails the collection of test_online.py).

In the weightlift run, a test module still holding one of vLLM's
weight_utils/ep_weight_filter functions after the rewrite fails the
collection; with WL_SUITE_TOUCHED=FILE, each test's node id is written to
FILE when it ran code of the weightlift package (run.py --touched).

  WL_SUITE_TARGET=weightlift | vllm  (set by run.py)
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile

import pytest

TARGET = os.environ["WL_SUITE_TARGET"]  # weightlift | vllm

_HUB = "downloads a model from huggingface.co, which this machine cannot reach"
NEEDS_HUB = {
    "model_executor/test_weight_utils.py::test_download_weights_from_hf": _HUB,
    "model_executor/model_loader/test_ep_weight_filter.py::TestSafetensorsWeightsIteratorWithEpFilter": _HUB,
    "model_executor/model_loader/runai_streamer_loader/test_weight_utils.py::test_runai_model_loader": _HUB,
    # ModelConfig() is Qwen/Qwen3-0.6B's, read from the Hub.
    "model_executor/model_loader/test_reload.py::test_attention_reload_defers_post_load": _HUB,
    "model_executor/model_loader/test_reload.py::test_attention_first_load_processes_weights": _HUB,
}


# vLLM's calls into packages weightlift's iterators of the same name do not
# use, and which tests/vllm034/requirements.txt does not install.
_IT = ("asserts the arguments vLLM passes the instanttensor package (mocked); weightlift's iterator does "
       "not use the package (its own collective and filter rules: tests/python/test_gpu.py)")
_RUNAI = ("needs the runai-model-streamer package, not installed here; weightlift's iterator does not use it "
          "(tests/python/s3/test_s3_objstore.py)")
NOT_CLAIMED = {
    "model_executor/model_loader/instanttensor_loader/test_weight_utils.py::test_instanttensor_ep_collective_loading":
        _IT,
    "model_executor/model_loader/instanttensor_loader/test_weight_utils.py::test_instanttensor_embedding_table_routing":
        _IT + ", through vLLM's DefaultModelLoader",
    "model_executor/model_loader/runai_streamer_loader/test_weight_utils.py::"
    "test_runai_safetensors_weights_iterator_yields_owned_tensors": _RUNAI,
    "model_executor/model_loader/runai_streamer_loader/test_weight_utils.py::"
    "test_runai_safetensors_weights_iterator_streamer_versions":
        "asserts the arguments vLLM passes runai-model-streamer's SafetensorsStreamer (faked); weightlift's "
        "iterator does not use the package",
}


def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def _matches(nodeid: str, key: str) -> bool:
    nodeid = nodeid.removeprefix("tests/")
    return nodeid == key or nodeid.startswith(key + "::") or nodeid.startswith(key + "[")


def pytest_collection_modifyitems(config, items):
    hub = None
    for item in items:
        for key, reason in NOT_CLAIMED.items():
            if _matches(item.nodeid, key):
                item.add_marker(pytest.mark.skip(reason=reason))
        for key, reason in NEEDS_HUB.items():
            if _matches(item.nodeid, key):
                if hub is None:
                    hub = _hub_reachable()
                if not hub:
                    item.add_marker(pytest.mark.skip(reason=reason))


def _cpu_config():
    """VllmConfig() with its device "cpu": vLLM's CUDA build finds no device
    to infer on a machine without a GPU (vLLM's fixtures use VllmConfig())."""
    from vllm.config import DeviceConfig, VllmConfig

    return VllmConfig(device_config=DeviceConfig(device="cpu"))


@pytest.fixture
def default_vllm_config():
    """vLLM's: a default VllmConfig current for the test (device "cpu")."""
    from vllm.config import set_current_vllm_config

    config = _cpu_config()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture
def dist_init():
    """vLLM's: a one-process world with model parallelism 1, under a default
    VllmConfig when none is current; gloo, as vLLM picks on CPU platforms."""
    from vllm.config import get_current_vllm_config_or_none, set_current_vllm_config
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        init_distributed_environment,
        initialize_model_parallel,
    )

    fd, store = tempfile.mkstemp()
    os.close(fd)
    current = get_current_vllm_config_or_none()
    try:
        with contextlib.nullcontext() if current is not None else set_current_vllm_config(_cpu_config()):
            init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{store}",
                                         local_rank=0, backend="gloo")
            initialize_model_parallel(1, 1)
            yield
        cleanup_dist_env_and_memory()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(store)


@pytest.fixture
def disable_log_dedup(monkeypatch):
    """vLLM's: warning_once and info_once print every time (their lru_cache
    bypassed), so that caplog sees a message logged once before."""
    from vllm import logger

    monkeypatch.setattr(logger, "_print_warning_once", logger._print_warning_once.__wrapped__)
    monkeypatch.setattr(logger, "_print_info_once", logger._print_info_once.__wrapped__)
    monkeypatch.setattr(logger, "_print_debug_once", logger._print_debug_once.__wrapped__)


def pytest_configure(config):
    for mark in ("cpu_test", "slow_test", "skip_global_cleanup", "optional", "core_model", "distributed"):
        config.addinivalue_line("markers", f"{mark}: vLLM's test mark")
    _no_gpu_no_quant_method()


def _no_gpu_no_quant_method():
    """tests/quantization/utils.py's is_quant_method_supported() says False
    on vLLM's CPU platform ("quantization tests only run GPUs") but asserts a
    device capability on the platform vLLM's CUDA build picks without a GPU,
    which fails the collection of test_online.py (its GPU tests' skipif). Here
    it says False there too: those tests skip, by their own condition."""
    import tests.quantization.utils as quant_utils
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike() or current_platform.get_device_capability() is not None:
        return
    original = quant_utils.is_quant_method_supported
    quant_utils.is_quant_method_supported = lambda method: False
    quant_utils.is_quant_method_supported.__wrapped__ = original


_VLLM_MODULES = ("vllm.model_executor.model_loader.weight_utils", "vllm.model_executor.model_loader.ep_weight_filter")


def pytest_collection_finish(session):
    """The weightlift run: no collected test module holds vLLM's functions."""
    if TARGET != "weightlift":
        return
    for module in {item.module for item in session.items if getattr(item, "module", None)}:
        for name, value in vars(module).items():
            owner = getattr(value, "__module__", None) or getattr(value, "__name__", None)
            if owner in _VLLM_MODULES:
                raise pytest.UsageError(f"{module.__name__}: {name} is vLLM's ({owner}), not weightlift's")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """With WL_SUITE_TOUCHED: whether the test ran weightlift's code."""
    path = os.environ.get("WL_SUITE_TOUCHED")
    if not path:
        yield
        return
    import weightlift

    root = os.path.dirname(weightlift.__file__)
    touched = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            touched.append(True)
            sys.setprofile(None)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        if touched:
            with open(path, "a") as f:
                f.write(item.nodeid + "\n")
