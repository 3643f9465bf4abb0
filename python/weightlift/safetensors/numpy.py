"""safetensors.numpy (0.9, the same as 0.8) over weightlift: save / save_file / load / load_file.

    from weightlift.safetensors.numpy import load_file, save_file   # was: from safetensors.numpy import ...

Arrays are written as safetensors writes them (little-endian; the same
bytes). Where safetensors 0.8 would write a non-contiguous array's raw memory
(wrong values), this writes its values; a non-dict or a value that is not an
array is a ValueError (safetensors lets an AttributeError escape).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from .. import _st
from .._st import SafetensorError, TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401

__all__ = ["save", "save_file", "load", "load_file"]

# safetensors dtype name -> numpy dtype.
_TYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "U64": np.uint64,
    "I32": np.int32, "U32": np.uint32, "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8,
    "BOOL": bool, "C64": np.complex64,
}


def _getdtype(dtype_str: str) -> np.dtype:
    return _TYPES[dtype_str]


def _is_little_endian(tensor: np.ndarray) -> bool:
    order = tensor.dtype.byteorder
    if order == "=":
        return sys.byteorder == "little"
    if order in ("|", "<"):
        return True
    if order == ">":
        return False
    raise ValueError(f"Unexpected byte order {order}")


def _specs(tensor_dict: dict[str, np.ndarray], keep: list) -> dict[str, TensorSpec]:
    """{name: TensorSpec} over each array's memory (a little-endian,
    C-contiguous copy where the array is not one, held in `keep`)."""
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    specs = {}
    for k, v in tensor_dict.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"Key `{k}` is invalid, expected np.ndarray but received {type(v)}")
        if not _is_little_endian(v):
            v = v.byteswap().view(v.dtype.newbyteorder("<"))
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        keep.append(v)
        specs[k] = TensorSpec(dtype=v.dtype.name, shape=v.shape, data_ptr=v.ctypes.data, data_len=v.nbytes)
    return specs


def save(tensor_dict: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding `tensor_dict`; `metadata` is a
    str -> str map stored in the header."""
    keep: list = []
    return serialize(_specs(tensor_dict, keep), metadata=metadata)


def save_file(tensor_dict: dict[str, np.ndarray], filename: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
    """Writes `tensor_dict` to `filename` in safetensors format, atomically."""
    keep: list = []
    serialize_file(_specs(tensor_dict, keep), filename, metadata=metadata)


def load(data: bytes) -> dict[str, np.ndarray]:
    """Every array of a safetensors file held in memory (writable arrays over one copy of its data)."""
    buf, base, tensors = _st._data_blocks(data, _TYPES)
    return {name: np.frombuffer(buf, dtype=dt, count=(e - b) // np.dtype(dt).itemsize, offset=b - base).reshape(shape)
            for name, dt, _, shape, b, e in tensors}


def load_file(filename: str | os.PathLike, *, backend: str = "mmap") -> dict[str, np.ndarray]:
    """Every array of a safetensors file, in file order."""
    with safe_open(filename, framework="np", backend=backend) as f:
        return f.get_tensors()
