"""vllm_compat.get_quant_config against the installed vLLM's own
get_quant_config, on the same ModelConfig (no engine start): online
quantization arguments beside a checkpoint's config are that config's
online_quantization_config (vLLM's maybe_compose_online_quantization), a raw
dict there is an AssertionError, the online methods' shorthands, and a plain
checkpoint. vLLM 0.34's own tests/quantization/test_online.py runs the same
in the 0.34 step (tests/vllm034/suite/run.py); this file also covers 0.32.
Run in the vLLM 0.32 venv (scripts/test's tests/vllm) and the 0.34 one."""
from __future__ import annotations

import json

import pytest

from weightlift import vllm_compat

_AWQ = {"quantize_config.json": {"w_bit": 4, "q_group_size": 128, "zero_point": True}}
_CT = {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                               "config_groups": {}}}


def _folder(tmp_path, files=None):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
              "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 32,
              "max_position_embeddings": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, value in (files or {}).items():
        (tmp_path / name).write_text(json.dumps(value))
    return str(tmp_path)


def _online_args():
    from pydantic import TypeAdapter
    from vllm.config.quantization import QuantizationConfigArgs

    return TypeAdapter(QuantizationConfigArgs).validate_python({"linear": {"weight": "mxfp8"}})


CASES = {  # name: (quantization, files, online arguments, hf_overrides)
    "awq beside online arguments": ("awq", _AWQ, "args", None),
    "awq": ("awq", _AWQ, None, None),
    "compressed-tensors beside a raw dict": ("compressed-tensors", None, {"linear": "mxfp8"}, _CT),
    "compressed-tensors beside online arguments": ("compressed-tensors", None, "args", _CT),
    "fp8_per_block": ("fp8_per_block", None, None, None),
    "mxfp4 beside online arguments": ("mxfp4", None, "args", None),
}


def _outcome(fn, model_config):
    from vllm.config.load import LoadConfig

    try:
        r = fn(model_config, LoadConfig())
    except Exception as e:  # the same exception class is the expectation
        return ("raises", type(e).__name__)
    online = getattr(r, "online_quantization_config", None)
    return (type(r).__name__, repr(getattr(r, "args", None)), type(online).__name__,
            repr(getattr(online, "args", None)), {k: v for k, v in vars(r).items() if isinstance(v, (int, bool))})


@pytest.mark.parametrize("case", CASES)
def test_get_quant_config_as_vllms(tmp_path, case):
    from vllm.config.model import ModelConfig
    from vllm.model_executor.model_loader import weight_utils

    quantization, files, online, overrides = CASES[case]
    kwargs = {"hf_overrides": overrides} if overrides else {}
    model_config = ModelConfig(model=_folder(tmp_path, files), quantization=quantization,
                               quantization_config=_online_args() if online == "args" else online, **kwargs)
    want = _outcome(weight_utils.get_quant_config, model_config)
    assert _outcome(vllm_compat.get_quant_config, model_config) == want
    if online == "args" and quantization in ("awq", "compressed-tensors"):
        assert want[2] == "OnlineQuantizationConfig"  # the composition this file is about
    if isinstance(online, dict):
        assert want == ("raises", "AssertionError")
