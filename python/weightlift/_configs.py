"""vLLM's quantization and sparse-attention configs. The resolution (which
source wins, which file, the vLLM branches) is the engine's
(quant_config.h); here only the objects around it.

Imports _core, _hub (the Hub's offline flag) and _log."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from . import _core
from ._hub import hf_offline
from ._log import logger


@dataclass
class QuantizationConfigResult:
    """get_quant_config's answer when vLLM is not importable: what the
    method's from_config() (or from_config_file / from_config_dict_json)
    would receive, and where it came from."""
    quantization: str
    config: dict = field(default_factory=dict)
    # hf_config, text_config, compression_config, hf_overrides.quantization_config_file,
    # hf_overrides.quantization_config_dict_json, online, inflight_bitsandbytes, default, file
    source: str = "default"
    file: str | None = None
    folder: str | None = None


def _as_dict(obj) -> dict | None:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj
    for attr in ("to_dict", "model_dump"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            return fn()
    return dict(vars(obj))


def _resolve_quant_config(model_config, load_config, with_online: bool = True) -> QuantizationConfigResult:
    """with_online=False: the online arguments are not a source (vLLM reads
    them as the config only for OnlineQuantizationConfig's methods)."""
    quantization = getattr(model_config, "quantization", None)
    if quantization is None:
        raise ValueError("Model quantization method is not specified in the config.")
    hf = _as_dict(getattr(model_config, "hf_config", None))
    overrides = getattr(model_config, "hf_overrides", None)
    if overrides is None or callable(overrides):
        # A callable hf_overrides transforms configs (SpeculativeConfig's for
        # draft models): it carries no quantization config entries.
        overrides = {}
    if not isinstance(overrides, dict):
        raise ValueError("hf_overrides must be a dict for get_quant_config to get the quantization config from it.")
    online = getattr(model_config, "quantization_config", None)
    online_json = None if online is None or not with_online else json.dumps(_as_dict(online), default=str)
    config, source, file, folder = _core.get_quant_config(
        os.fspath(model_config.model), quantization, None if hf is None else json.dumps(hf, default=str),
        json.dumps(overrides, default=str), online_json, getattr(model_config, "revision", None) or "",
        getattr(load_config, "download_dir", None) or "", hf_offline())
    return QuantizationConfigResult(quantization, json.loads(config), source, file or None, folder or None)


def get_quant_config(model_config, load_config):
    """vLLM's get_quant_config: vLLM's QuantizationConfig object when vLLM is
    importable, else a QuantizationConfigResult with what it would be built from.
    As vLLM's: online arguments beside a checkpoint's config (or a method's
    defaults) become its online_quantization_config; they are the config
    itself only for OnlineQuantizationConfig's methods."""
    try:
        from vllm.model_executor.layers.quantization import get_quantization_config
        from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    except ImportError:
        return _resolve_quant_config(model_config, load_config)
    if getattr(model_config, "quantization", None) is None:
        raise ValueError("Model quantization method is not specified in the config.")
    quant_cls = get_quantization_config(model_config.quantization)
    online = getattr(model_config, "quantization_config", None)
    r = _resolve_quant_config(model_config, load_config, with_online=quant_cls is OnlineQuantizationConfig)
    if r.source == "online":
        _check_online_weight_keys(online)
        return OnlineQuantizationConfig(args=online)
    if r.source == "hf_overrides.quantization_config_file":
        return _compose_online(quant_cls.from_config_file(r.file), online)
    if r.source == "hf_overrides.quantization_config_dict_json":
        return _compose_online(
            quant_cls.from_config_dict_json(model_config.hf_overrides["quantization_config_dict_json"]), online)
    if r.source == "default":
        shorthand = _online_shorthand(r.quantization, online)
        return _compose_online(quant_cls(), online) if shorthand is None else shorthand
    config = r.config
    if _is_modelopt(quant_cls):  # ModelOpt's configs take the online arguments themselves
        _require_online_args(online, allow_none=True)
        config = {**config, "_online_quantization_args": online}
    return _compose_online(quant_cls.from_config(config), online)


def _require_online_args(online, allow_none: bool = False) -> None:
    """vLLM asserts model_config.quantization_config is a normalized
    QuantizationConfigArgs (a raw dict is the caller's mistake): AssertionError."""
    try:
        from vllm.config.quantization import QuantizationConfigArgs
    except ImportError:
        return
    if not (isinstance(online, QuantizationConfigArgs) or (allow_none and online is None)):
        raise AssertionError(f"quantization_config must be a QuantizationConfigArgs, not {type(online).__name__} "
                             f"(normalize it with vllm.config.quantization.resolve_quantization_config)")


def _compose_online(checkpoint_config, online):
    """vLLM's maybe_compose_online_quantization: online arguments beside a
    checkpoint's config are its online_quantization_config."""
    if online is None:
        return checkpoint_config
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    _require_online_args(online)
    checkpoint_config.online_quantization_config = OnlineQuantizationConfig(online)
    return checkpoint_config


def _is_modelopt(quant_cls) -> bool:
    try:
        from vllm.model_executor.layers.quantization.modelopt import ModelOptQuantConfigBase
    except ImportError:
        return False
    return issubclass(quant_cls, ModelOptQuantConfigBase)


def _check_online_weight_keys(args) -> None:
    """vLLM 0.34: standalone online quantization whose linear, moe or target
    spec sets no weight key would quantize nothing (ValueError)."""
    try:
        from vllm.config.quantization import QuantSpec
    except ImportError:  # vLLM 0.32: no such check
        return
    specs = [(kind, getattr(args, kind, None)) for kind in ("linear", "moe")]
    specs += [(f"targets[{p}]", t) for p, t in (getattr(args, "targets", None) or {}).items()]
    for name, spec in specs:
        if isinstance(spec, QuantSpec) and "weight" not in spec.fields_set:
            raise ValueError(f"quantization_config.{name} = {spec} does not set a weight quantization key, "
                             f"which online quantization requires.")


def _online_shorthand(quantization: str, online):
    """An online-quantization shorthand ("fp8_per_tensor", ...) with no config
    file: vLLM's OnlineQuantizationConfig of the shorthand's arguments, the
    user's merged over them (0.34; 0.32: the user's instead of them); `fp8`
    is fp8_per_tensor (deprecated). None for any other method."""
    try:
        from vllm.config import quantization as q
        from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    except ImportError:
        return None
    shorthands = getattr(q, "_ONLINE_SHORTHANDS", {})
    if quantization == "fp8" and hasattr(q, "resolve_quantization_config"):
        logger.warning("--quantization fp8 is deprecated for online quantization; use --quantization "
                       "fp8_per_tensor instead.")
        return OnlineQuantizationConfig(args=q.resolve_quantization_config("fp8_per_tensor", online))
    if quantization not in shorthands:
        return None
    merge = getattr(q, "merge_quantization_config", None)
    args = merge(shorthands[quantization], online) if merge else (online or shorthands[quantization])
    return OnlineQuantizationConfig(args=args)


def get_sparse_attention_config(model_config, load_config,
                                sparse_attention_config_filename: str = "sparse_attention_config.json") -> dict:
    """<model folder>/<file name> parsed, or {} when the model has none
    (remote models: their *.json files downloaded first, under the model's lock)."""
    config = json.loads(_core.get_sparse_attention_config(
        os.fspath(model_config.model), getattr(model_config, "revision", None) or "",
        getattr(load_config, "download_dir", None) or "", sparse_attention_config_filename, hf_offline()))
    if config:
        logger.info("Loaded sparse attention config from %s", sparse_attention_config_filename)
    return config
