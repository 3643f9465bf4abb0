"""Object-storage models (s3://, gs://) under `--load-format weightlift`.

vLLM 0.32 handles `--model s3://bucket/prefix` in ModelConfig: it pulls the
configs and tokenizer files (*.json, *.model, *.py) into
~/.cache/vllm/assets/model_streamer/<hash> with runai-model-streamer, keeps
the URL in model_config.model_weights, and then VllmConfig refuses every load
format but modelexpress / runai_streamer / runai_streamer_sharded for such a
model (`auto` becomes runai_streamer). weightlift reads such models itself,
so the plug-in gets past that one check, deliberately and narrowly: while
VllmConfig.try_verify_and_update_config() runs for a `weightlift` load of an
object-storage model, the load format reads `runai_streamer` (a format the
check accepts), and is `weightlift` again as soon as it returns. Nothing else
in that method looks at the load format (checked against vLLM 0.32's source).

It fails loudly where vLLM changes: the plug-in refuses to install the bypass
(and says so in the log) when VllmConfig has no try_verify_and_update_config
or its source no longer holds the check, and raises when vLLM rewrote the
load format during the call.
"""
from __future__ import annotations

import inspect
import logging

logger = logging.getLogger("weightlift.vllm")

FORMAT = "weightlift"
POSE_AS = "runai_streamer"
_CHECK_TEXT = "To load a model from object storage"
SCHEMES = ("s3://", "gs://", "az://")


class ObjectStorageBypassError(RuntimeError):
    pass


def _is_object_uri(path) -> bool:
    return isinstance(path, str) and path.lower().startswith(SCHEMES)


def install_bypass() -> bool:
    """Wraps VllmConfig.try_verify_and_update_config (idempotent). True when
    installed (or already there); False, with a warning, when this vLLM does
    not have the check as 0.32 has it."""
    try:
        from vllm.config.vllm import VllmConfig
    except ImportError as e:
        logger.warning("weightlift: cannot find vLLM's VllmConfig (%s); s3:// and gs:// models need "
                       "--load-format runai_streamer on this vLLM", e)
        return False
    current = getattr(VllmConfig, "try_verify_and_update_config", None)
    if current is None:
        logger.warning("weightlift: this vLLM has no VllmConfig.try_verify_and_update_config; the plug-in does "
                       "not know how it checks object-storage models, so it leaves them alone")
        return False
    if getattr(current, "__weightlift_bypass__", False):
        return True
    try:
        source = inspect.getsource(current)
    except (OSError, TypeError):
        source = ""
    if _CHECK_TEXT not in source or "load_format" not in source:
        logger.warning("weightlift: VllmConfig.try_verify_and_update_config no longer holds the object-storage "
                       "load-format check this plug-in was written for (vLLM 0.32); object-storage models go "
                       "through vLLM's own checks unchanged")
        return False

    def try_verify_and_update_config(self, *args, **kwargs):
        inner = try_verify_and_update_config.__wrapped__  # vLLM's method
        load = getattr(self, "load_config", None)
        model = getattr(self, "model_config", None)
        if (load is None or model is None or getattr(load, "load_format", None) != FORMAT
                or not _is_object_uri(getattr(model, "model_weights", "") or "")):
            return inner(self, *args, **kwargs)
        load.load_format = POSE_AS
        try:
            return inner(self, *args, **kwargs)
        finally:
            seen = load.load_format
            load.load_format = FORMAT
            if seen != POSE_AS:
                raise ObjectStorageBypassError(
                    f"weightlift: vLLM changed the load format of the object-storage model "
                    f"{model.model_weights} from {POSE_AS!r} (weightlift's stand-in during vLLM's check) to "
                    f"{seen!r}; this vLLM is not the one the plug-in knows; use --load-format runai_streamer")

    try_verify_and_update_config.__weightlift_bypass__ = True
    try_verify_and_update_config.__wrapped__ = current
    try_verify_and_update_config.__doc__ = current.__doc__
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config
    return True
