"""What model code does with a checkpoint's tensors and its parameters:
weight loaders (copies into parameters), dummy values, name remapping. The
rules are the engine's (dummy.h, remap.h); here the torch glue on the
caller's tensors, any device.

The tensor-parallel loaders (row_parallel_weight_loader,
sharded_weight_loader) live in weight_utils beside
get_tensor_model_parallel_rank, which vLLM's tests patch there.

A leaf: imports only _core, _log and _tensors."""
from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from typing import Any

import torch

from . import _core
from ._log import log_once
from ._tensors import TORCH_TO_NAME

LoaderFunction = Callable[[torch.Tensor, torch.Tensor], None]


# ---- weight loaders ---------------------------------------------------------------------------


def convert_pyslice_to_tensor(x: Any) -> torch.Tensor:
    """A slice object (safetensors' get_slice) read whole; tensors pass through."""
    if not isinstance(x, torch.Tensor):
        x = x[:]
    return x


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copies `loaded_weight` into `param` in place; one-element tensors of any
    shape match each other, otherwise the sizes must be equal (AssertionError)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.copy_(loaded_weight.view(param.shape))
        return
    assert param.size() == loaded_weight.size(), (
        f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
    param.data.copy_(loaded_weight)


def composed_weight_loader(loader: LoaderFunction, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoaderFunction:
    """A loader that runs `loader`, then replaces the param with fn(param)."""

    def composed(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        loader(param, loaded_weight)
        param.data.copy_(fn(param))

    return composed


# ---- dummy weights ------------------------------------------------------------------------------


def initialize_dummy_weights(model: torch.nn.Module, model_config: Any = None, low: float = -1e-3,
                             high: float = 1e-3, seed: int = 1234) -> None:
    """Fills every floating-point tensor of the model's state_dict with
    uniform [low, high) values of the engine's counter-based generator
    (dummy.h): a value depends only on the seed, its index and the dtype, so
    tensors of equal size agree and TP ranks and runs are identical."""
    for param in model.state_dict().values():
        initialize_single_dummy_weight(param, low, high, seed)


@torch.no_grad()
def initialize_single_dummy_weight(param: torch.Tensor, low: float = -1e-3, high: float = 1e-3,
                                   seed: int = 1234) -> None:
    if param.device.type == "meta":
        return
    if not torch.is_floating_point(param):
        if getattr(torch.version, "hip", None):
            param.zero_()  # ROCm leaves integer params uninitialised
        return
    name = TORCH_TO_NAME.get(param.dtype)
    if name is None or not _core.dummy_fills(name):
        raise NotImplementedError(f"dummy weights of dtype {param.dtype} are not supported")
    if param.device.type == "cuda" and param.is_contiguous() and param.numel():
        index = param.device.index if param.device.index is not None else torch.cuda.current_device()
        if fill_dummy_on_device(name, param.data_ptr(), param.numel(), index, low, high, seed):
            return
    host = param.data
    if host.device.type != "cpu" or not host.is_contiguous():
        host = torch.empty(param.shape, dtype=param.dtype)
    if host.numel():
        _core.fill_dummy(name, host.data_ptr(), host.numel() * host.element_size(), host.numel(), low, high, seed)
    if host is not param.data:
        param.data.copy_(host)


def fill_dummy_on_device(dtype: str, ptr: int, numel: int, device: int, low: float, high: float, seed: int) -> bool:
    """Dummy values written by the engine's CUDA kernel straight into device
    memory at `ptr` (the same bytes as the host fill); False when the
    kernels library (libweightlift_cuda.so) cannot be loaded, logged once
    (the caller then fills on the host and copies)."""
    try:
        _core.fill_dummy_device(dtype, ptr, numel, low, high, seed, device)
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
    remapped, warnings = _core.maybe_remap_kv_scale_name(name, params_dict)
    for w in warnings:
        log_once(logging.WARNING, "%s", w)
    return remapped


def maybe_remap_moe_expert_param_name(name: str, params_dict: dict) -> str:
    """'...experts.w13_weight' -> '...experts.routed_experts.w13_weight' when the
    model has the latter (the newer fused-MoE module layout); else unchanged."""
    return _core.maybe_remap_moe_expert_param_name(name, params_dict)


def remap_moe_expert_weights(weights: Iterable[tuple[str, torch.Tensor]],
                             params_dict: dict) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Wraps a weights iterator, remapping MoE expert names as above."""
    for name, weight in weights:
        yield maybe_remap_moe_expert_param_name(name, params_dict), weight
