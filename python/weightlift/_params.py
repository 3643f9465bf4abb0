"""What model code does with a checkpoint's tensors and its parameters:
weight loaders (copies into parameters), dummy values, name remapping. The
rules are the engine's (dummy.h, remap.h); here the torch glue on the
caller's tensors, any device.

The tensor-parallel loaders (row_parallel_weight_loader,
sharded_weight_loader) live in weight_utils beside
get_tensor_model_parallel_rank, which vLLM's tests patch there.

A leaf: imports only the bridge (_engine), _log and _tensors."""
from __future__ import annotations

import logging
import mmap
from collections.abc import Callable, Generator, Iterable
from typing import Any

import torch

from . import _engine
from ._log import log_once
from ._tensors import TORCH_TO_NAME

LoaderFunction = Callable[[torch.Tensor, torch.Tensor], None]


# ---- weight loaders ---------------------------------------------------------------------------


def convert_pyslice_to_tensor(x: Any) -> torch.Tensor:
    """A slice object (safetensors' get_slice) read whole; tensors pass through."""
    if not isinstance(x, torch.Tensor):
        x = x[:]
    return x


def _is_integrated_gpu(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        return bool(torch.cuda.get_device_properties(device).is_integrated)
    except Exception:  # no CUDA runtime: not a GPU we copy to
        return False


def copy_weight_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) for weight loaders (vLLM 0.34). Onto an integrated GPU
    from a contiguous host tensor of the same dtype (a file mapping), one
    byte per page of `src` is read first, so that its page faults are taken
    on the CPU rather than inside the driver's copy; elsewhere a plain copy_."""
    if (src.device.type == "cpu" and src.dtype == dst.dtype and src.numel() > 1 and src.is_contiguous()
            and _is_integrated_gpu(dst.device)):
        flat = src.reshape(-1).view(torch.uint8)
        flat[::mmap.PAGESIZE].sum()
        flat[-1:].sum()
    return dst.copy_(src)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copies `loaded_weight` into `param` in place (copy_weight_); one-element
    tensors of any shape match each other, otherwise the sizes must be equal
    (AssertionError)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        copy_weight_(param.data, loaded_weight.view(param.shape))
        return
    assert param.size() == loaded_weight.size(), (
        f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
    copy_weight_(param.data, loaded_weight)


def composed_weight_loader(loader: LoaderFunction, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoaderFunction:
    """A loader that runs `loader`, then replaces the param with fn(param)."""

    def composed(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        loader(param, loaded_weight)
        param.data.copy_(fn(param))

    return composed


# ---- dummy weights ------------------------------------------------------------------------------


def initialize_dummy_weights(model: torch.nn.Module, model_config: Any = None, low: float | None = None,
                             high: float | None = None, seed: int = 1234) -> None:
    """Fills every tensor of the model's state_dict as
    initialize_single_dummy_weight does (by dtype and name): floats with
    uniform [low, high) values of the engine's counter-based generator
    (dummy.h), where a value depends only on the seed, its index and the
    dtype, so tensors of equal size agree and TP ranks and runs are identical."""
    for name, param in model.state_dict().items():
        initialize_single_dummy_weight(param, low, high, seed, name=name)


# E8M0 scales: byte 120 is 2**-7 (dequantized dummy weights stay small and finite).
_DUMMY_E8M0_SCALE_BYTE = 120
# 8-bit floats: the default range (+-1e-3 lies below FP8 E4M3's smallest normal).
_DUMMY_FP8_RANGE = 1.0
_RANDOM_BYTE_DTYPES = tuple(d for d in (torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", None)) if d)
_E8M0 = getattr(torch, "float8_e8m0fnu", None)


@torch.no_grad()
def initialize_single_dummy_weight(param: torch.Tensor, low: float | None = None, high: float | None = None,
                                   seed: int = 1234, name: str = "") -> None:
    """Deterministic dummy values for one tensor, by dtype (vLLM 0.34's rules):
    a `dummy_weight_value` attribute fills it; E8M0 scales (float8_e8m0fnu, or
    uint8 named like a scale) get byte 120; uint8, int8 and packed FP4 get
    random bytes of torch's generator seeded with `seed` (vLLM's bytes); other
    integers are left alone (zeroed on ROCm); floats get uniform values in
    [low, high] of the engine's generator, the range defaulting to +-1e-3,
    or +-1 for 8-bit floats. Meta tensors are left alone."""
    if param.device.type == "meta":
        return
    value = getattr(param, "dummy_weight_value", None)
    if value is not None:
        param.fill_(value)
        return
    if param.dtype == _E8M0 or (param.dtype == torch.uint8 and "scale" in name):
        param.view(torch.uint8).fill_(_DUMMY_E8M0_SCALE_BYTE)
        return
    if param.dtype in _RANDOM_BYTE_DTYPES:
        generator = torch.Generator(device=param.device)
        generator.manual_seed(seed)
        if param.dtype == torch.int8:
            param.random_(-128, 128, generator=generator)
        else:
            param.view(torch.uint8).random_(0, 256, generator=generator)
        return
    if not torch.is_floating_point(param):
        if getattr(torch.version, "hip", None):
            param.zero_()  # ROCm leaves integer params uninitialised
        return
    if low is None or high is None:
        r = _DUMMY_FP8_RANGE if torch.finfo(param.dtype).bits < 16 else 1e-3
        low = -r if low is None else low
        high = r if high is None else high
    name = TORCH_TO_NAME.get(param.dtype)
    if name is None or not _engine.dummy_fills(name):
        raise NotImplementedError(f"dummy weights of dtype {param.dtype} are not supported")
    if param.device.type == "cuda" and param.is_contiguous() and param.numel():
        index = param.device.index if param.device.index is not None else torch.cuda.current_device()
        if fill_dummy_on_device(name, param.data_ptr(), param.numel(), index, low, high, seed):
            return
    host = param.data
    if host.device.type != "cpu" or not host.is_contiguous():
        host = torch.empty(param.shape, dtype=param.dtype)
    if host.numel():
        _engine.fill_dummy(name, host.data_ptr(), host.numel() * host.element_size(), host.numel(), low, high, seed)
    if host is not param.data:
        param.data.copy_(host)


def fill_dummy_on_device(dtype: str, ptr: int, numel: int, device: int, low: float, high: float, seed: int) -> bool:
    """Dummy values written by the engine's CUDA kernel straight into device
    memory at `ptr` (the same bytes as the host fill); False when the
    kernels library (libweightlift_cuda.so) cannot be loaded, logged once
    (the caller then fills on the host and copies)."""
    try:
        _engine.fill_dummy_device(dtype, ptr, numel, low, high, seed, device)
        return True
    except ConnectionError as e:  # kUnavailable: the kernels library is missing
        if "libweightlift_cuda" not in str(e):
            raise
        log_once(logging.WARNING, "dummy weights are filled on the host and copied: %s", e)
        return False


# ---- name remapping ---------------------------------------------------------------------------------
# The rules are the engine's (remap.h); params_dict is asked for membership in place.


def maybe_remap_kv_scale_name(name: str, params_dict: dict) -> str | None:
    """The model's name for a checkpoint's FP8 k/v/q scale (or zero point), the
    name itself when no remapping applies, or None when the remapped name is
    not a parameter of the model (the scale is then not loaded)."""
    remapped, warnings = _engine.maybe_remap_kv_scale_name(name, params_dict)
    for w in warnings:
        log_once(logging.WARNING, "%s", w)
    return remapped


def maybe_remap_moe_expert_param_name(name: str, params_dict: dict) -> str:
    """'...experts.w13_weight' -> '...experts.routed_experts.w13_weight' when the
    model has the latter (the newer fused-MoE module layout); else unchanged."""
    return _engine.maybe_remap_moe_expert_param_name(name, params_dict)


def remap_moe_expert_weights(weights: Iterable[tuple[str, torch.Tensor]],
                             params_dict: dict) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Wraps a weights iterator, remapping MoE expert names as above."""
    for name, weight in weights:
        yield maybe_remap_moe_expert_param_name(name, params_dict), weight
