"""weightlift as a vLLM load format: `vllm serve MODEL --load-format weightlift`
or `LLM(model=..., load_format="weightlift")` once weightlift is installed.

vLLM runs the entry point `weightlift` of the group `vllm.general_plugins`
(pyproject.toml) in every one of its processes (the front end, the engine
core, each worker, spawned or forked); register() then

  * registers WeightliftModelLoader (_loader.py) as the load format
    `weightlift` (vLLM's register_model_loader);
  * lets vLLM accept `weightlift` for s3:// and gs:// models, and fetches
    their configs itself where runai-model-streamer is not installed
    (_objstore.py);
  * routes weightlift's log lines through vLLM's log handlers.

It is safe to call any number of times and does nothing where vLLM is not
installed. Options: `--model-loader-extra-config` (see docs/vllm.md and
_options.Options).
"""
from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("weightlift.vllm")

LOAD_FORMAT = "weightlift"
_registered = False


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def register() -> None:
    """The vLLM plug-in entry point (idempotent; a no-op without vLLM)."""
    global _registered
    if _registered or not vllm_available():
        return
    import vllm.logger  # noqa: F401  (configures vLLM's log handlers, as every vLLM process does)
    from vllm.model_executor import model_loader as ml

    from . import _objstore, _progress

    _progress.route_to_vllm_log()
    table = getattr(ml, "_LOAD_FORMAT_TO_MODEL_LOADER", {})
    from ._loader import WeightliftModelLoader

    if table.get(LOAD_FORMAT) is not WeightliftModelLoader:
        ml.register_model_loader(LOAD_FORMAT)(WeightliftModelLoader)
    _objstore.install_bypass()
    _objstore.install_config_pull()
    _registered = True


__all__ = ["LOAD_FORMAT", "register", "vllm_available"]
