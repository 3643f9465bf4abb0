"""safetensors.torch (0.9, the same as 0.8) over weightlift: save / save_file / load / load_file /
save_model / load_model, with safetensors' checks, messages and results.

    from weightlift.safetensors.torch import load_file, save_file   # was: from safetensors.torch import ...

Writing refuses what safetensors refuses, with the same exception classes:
a non-dict (ValueError), a value that is not a tensor (ValueError), sparse
tensors (ValueError), tensors that share memory (RuntimeError; save_model
handles tied weights), non-contiguous tensors (ValueError), non-str names or
metadata (TypeError). The bytes written are safetensors' own for the same
input. Files are written atomically (a temporary renamed into place).
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import torch

from .. import _st
from .._st import SafetensorError, TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401
from .._tensors import TORCH_DTYPES

__all__ = ["save", "save_file", "load", "load_file", "save_model", "load_model", "storage_ptr", "storage_size"]

# torch dtype -> bytes per element (float4_e2m1fn_x2: one byte holds two values).
_SIZE: dict[torch.dtype, int] = {}
for _name, _bytes in (("int64", 8), ("float32", 4), ("int32", 4), ("bfloat16", 2), ("float16", 2), ("int16", 2),
                      ("uint8", 1), ("int8", 1), ("bool", 1), ("float64", 8), ("complex64", 8), ("uint64", 8),
                      ("uint32", 4), ("uint16", 2), ("float8_e4m3fn", 1), ("float8_e4m3fnuz", 1),
                      ("float8_e5m2", 1), ("float8_e5m2fnuz", 1), ("float8_e8m0fnu", 1), ("float4_e2m1fn_x2", 1)):
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _SIZE[_dt] = _bytes
# torch dtype -> the name TensorSpec takes.
_SPEC_NAME = {dt: str(dt).split(".")[-1] for dt in _SIZE}

# safetensors dtype name -> torch dtype (what this torch has).
_TYPES: dict[str, torch.dtype] = {k: v for k, v in TORCH_DTYPES.items() if k not in ("C32", "C128")}


def _getdtype(dtype_str: str) -> torch.dtype:
    return _TYPES[dtype_str]


class UnsupportedDtypeError(KeyError, TypeError):
    """A tensor whose dtype safetensors cannot store. A KeyError (what
    safetensors raises) and a TypeError (what weightlift raised before)."""

    __str__ = BaseException.__str__


UnsupportedDtypeError.__module__ = __name__


# ---- storage and sharing ------------------------------------------------------------------------

def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the storage behind `tensor` (0 for meta tensors)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:
        try:
            return tensor.storage().data_ptr()
        except NotImplementedError:
            return 0


def storage_size(tensor: torch.Tensor) -> int:
    """Bytes of the storage behind `tensor`."""
    try:
        return tensor.untyped_storage().nbytes()
    except AttributeError:
        try:
            return tensor.storage().size() * _SIZE[tensor.dtype]
        except NotImplementedError:
            return tensor.nelement() * _SIZE[tensor.dtype]


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte of `tensor`'s last element (its first byte when empty)."""
    if not tensor.nelement():
        return tensor.data_ptr()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * _SIZE[tensor.dtype]


def _filter_shared_not_shared(tensors: list[set[str]], state_dict: dict[str, torch.Tensor]) -> list[set[str]]:
    """Splits each group of names on one storage into groups whose byte ranges overlap."""
    out: list[set[str]] = []
    for names in tensors:
        if len(names) < 2:
            out.append(names)
            continue
        areas = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        stop = None
        for start, end, name in areas:
            if stop is not None and start < stop:
                out[-1].add(name)
                stop = max(stop, end)
            else:
                out.append({name})
                stop = end
    return out


def _find_shared_tensors(state_dict: dict[str, torch.Tensor]) -> list[set[str]]:
    """Groups of names whose tensors overlap in memory (a group of one for a
    tensor that shares with nothing); meta and empty storages are left out."""
    groups: dict[tuple, set[str]] = {}
    meta = torch.device("meta")
    for name, t in state_dict.items():
        if t.device == meta:
            continue
        ptr = storage_ptr(t)
        size = storage_size(t) if ptr else 0
        if ptr and size:
            groups.setdefault((t.device, ptr, size), set()).add(name)
    return _filter_shared_not_shared(list(groups.values()), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """True when `tensor` covers its whole storage from its first byte."""
    return tensor.data_ptr() == storage_ptr(tensor) and \
        tensor.nelement() * _SIZE[tensor.dtype] == storage_size(tensor)


def _remove_duplicate_names(state_dict: dict[str, torch.Tensor], *, preferred_names: list[str] | None = None,
                            discard_names: list[str] | None = None) -> dict[str, list[str]]:
    """{kept name: [names dropped in its favour]} for every group of shared
    tensors: the kept one covers the whole storage; among several, the first by
    name, preferring `preferred_names` and avoiding `discard_names`."""
    preferred = set(preferred_names or [])
    discard = set(discard_names or [])
    to_remove: dict[str, list[str]] = defaultdict(list)
    for shared in _find_shared_tensors(state_dict):
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no suitable name to keep"
                f" for saving amongst: {shared}. None is covering the entire storage.Refusing to save/load the model"
                " since you could be storing much more memory than needed. Please refer to"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors for more information. Or open an"
                " issue.")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


# ---- writing ----------------------------------------------------------------------------------------

def _check_for_save(tensors) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support. You can make it"
            " a dense tensor before saving with `.to_dense()` but be aware this might make a much larger file than"
            " needed.")
    failing = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(
            f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {failing}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """)  # noqa: E501 - safetensors' message, word for word


def _specs(tensors: dict[str, torch.Tensor], keep: list) -> dict[str, TensorSpec]:
    """{name: TensorSpec} over each tensor's CPU memory; `keep` holds what must
    stay alive while it is written (CPU copies of device tensors)."""
    _check_for_save(tensors)
    specs = {}
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving.")
        name = _SPEC_NAME.get(v.dtype)
        if name is None:
            raise UnsupportedDtypeError(f"tensor `{k}`: dtype {v.dtype} cannot be stored in safetensors")
        if v.device.type != "cpu":
            v = v.to("cpu")
        if sys.byteorder == "big":  # safetensors files are little-endian
            v = _byteswapped(v)
        keep.append(v)
        n = v.nelement() * _SIZE[v.dtype]
        specs[k] = TensorSpec(dtype=name, shape=v.shape, data_ptr=v.data_ptr() if n else 0, data_len=n)
    return specs


def _byteswapped(t: torch.Tensor) -> torch.Tensor:  # pragma: no cover - big-endian hosts only
    size = _SIZE[t.dtype]
    if size == 1 or not t.nelement():
        return t
    u = t.reshape(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size]).numpy().byteswap()
    return torch.from_numpy(u).view(t.dtype).reshape(t.shape)


def save(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding `tensors` (contiguous, dense,
    not sharing memory); `metadata` is a str -> str map stored in the header."""
    keep: list = []
    return serialize(_specs(tensors, keep), metadata=metadata)


def save_file(tensors: dict[str, torch.Tensor], filename: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
    """Writes `tensors` (contiguous, dense, not sharing memory) to `filename`
    in safetensors format, atomically. Do not modify the tensors while it runs."""
    keep: list = []
    serialize_file(_specs(tensors, keep), filename, metadata=metadata)


def save_model(model: torch.nn.Module, filename: str, metadata: dict[str, str] | None = None,
               force_contiguous: bool = True):
    """Saves `model`'s state dict, keeping one of each group of shared (tied)
    tensors; each dropped name is recorded in the metadata as `{dropped: kept}`
    (unless the caller's metadata already has that key)."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats.") from None


# ---- reading ------------------------------------------------------------------------------------------

def load_file(filename: str | os.PathLike, device: str | int = "cpu", *,
              backend: str = "mmap") -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, in file order, on `device`."""
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file held in memory (CPU tensors over one copy of its data)."""
    buf, base, tensors = _st._data_blocks(data, {**_TYPES, "F4": _st._F4})
    out = {}
    for name, dt, dtype, shape, b, e in tensors:
        if dtype == "F4":
            shape = _st._f4_shape(shape)
        if b == e:
            out[name] = torch.empty(shape, dtype=dt)
        else:
            out[name] = torch.frombuffer(buf, dtype=dt, count=(e - b) // _SIZE[dt], offset=b - base).view(shape)
    return out


def load_model(model: torch.nn.Module, filename: str | os.PathLike, strict: bool = True,
               device: str | int = "cpu", *, backend: str = "mmap") -> tuple[list[str], list[str]]:
    """Loads a file written by save_model (or save_file) into `model`, restoring
    tied tensors. Returns (missing, unexpected): names of the model the file did
    not fill, names of the file the model did not use; with strict (the default)
    either being non-empty raises RuntimeError listing them."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for dropped in to_removes.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected

