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


class ObjectStorageBypassError(RuntimeError):
    pass


def _is_object_uri(path) -> bool:
    """An object-storage URL weightlift reads (the engine's schemes, s3.h);
    imported here, not at plug-in registration, which stays light."""
    from .. import _engine

    return _engine.is_object_url(path)


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


# ---- the configs of an object-storage model without runai-model-streamer ----------------------------

_MAX_PULLED_FILE = 1 << 30  # configs and tokenizers; a larger object is refused before it is read
_MAX_DEPTH = 8


def _matches(rel: str, patterns) -> bool:
    import fnmatch

    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(base, p) for p in patterns)


def pull_files(model_path: str, dst: str, allow_pattern=None, ignore_pattern=None, *_ignored) -> list[str]:
    """runai_model_streamer.pull_files through weightlift's engine (its S3/GCS
    source, docs/s3.md): every object under the prefix `model_path`, recursively,
    whose relative key (or base name) matches one of `allow_pattern` (all when
    None) and none of `ignore_pattern`, written to dst/<relative key>
    atomically. Returns the relative keys written."""
    import os

    from .. import _engine

    prefix = model_path.rstrip("/")
    written = []

    def walk(url: str, rel: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        for name, is_dir, _size in _engine.list_dir(url):
            key = f"{rel}/{name}" if rel else name
            if is_dir:
                walk(f"{url}/{name}", key, depth + 1)
                continue
            if allow_pattern is not None and not _matches(key, allow_pattern):
                continue
            if ignore_pattern and _matches(key, ignore_pattern):
                continue
            data = _engine.read_small_file(f"{url}/{name}", _MAX_PULLED_FILE)
            target = os.path.join(dst, *key.split("/"))
            if os.path.commonpath([os.path.abspath(target), os.path.abspath(dst)]) != os.path.abspath(dst):
                raise ValueError(f"{url}/{name}: key escapes the destination folder")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.wl-partial-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
            written.append(key)

    walk(prefix, "", 0)
    return written


def install_config_pull() -> bool:
    """Where runai-model-streamer is not installed, vLLM cannot fetch an
    object-storage model's configs (its placeholder raises): hand vLLM's
    ObjectStorageModel weightlift's pull_files instead. Idempotent; True when
    installed."""
    import importlib.util

    if importlib.util.find_spec("runai_model_streamer") is not None:
        return False  # vLLM's own way works
    try:
        import vllm.transformers_utils.runai_utils as ru
    except ImportError:
        return False
    if getattr(ru, "runai_pull_files", None) is pull_files:
        return True
    if not hasattr(ru, "runai_pull_files"):
        logger.warning("weightlift: vLLM's runai_utils has no runai_pull_files; object-storage configs are left "
                       "to vLLM")
        return False
    ru.runai_pull_files = pull_files
    return True
