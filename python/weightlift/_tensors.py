"""Turning the engine's byte arrays into torch tensors and numpy arrays.

The C++ side hands over (dtype name, shape, bytes) where `bytes` is a 1-D
uint8 nanobind array over the tensor's memory (a copy-on-write file mapping or
a private buffer) that owns that memory. We import it zero-copy through DLPack
(torch; numpy arrays come from that tensor's .numpy()), then reinterpret the bytes with
`.view(dtype)` and `.view(shape)`: no element is copied.

dtypes torch lacks. torch 1.13 (Debian 12) has bfloat16 and complex32 but no
float8 and no uint16/32/64 (float8 arrived in torch 2.1, uint16/32/64 in 2.3).
For a tensor whose dtype this torch cannot represent we raise TypeError naming
the file, tensor and dtype, as the `safetensors` package does; set
WEIGHTLIFT_RAW_DTYPES=1 (or pass raw_dtypes=True to our own API) to get such
tensors as uint8 instead: the same bytes, shape [*shape, element_size]
(float8: [*shape, 1], so `.squeeze(-1)` gives the original shape).
"""
from __future__ import annotations

import os

import numpy as np

try:
    import torch
    from torch.utils import dlpack as _dlpack
except ImportError as e:  # pragma: no cover - torch is a hard requirement in practice
    raise ImportError(
        "weightlift needs PyTorch: install your platform's torch (e.g. Debian's python3-torch or a CUDA wheel)"
    ) from e

# safetensors dtype name -> torch attribute name, element size in bytes.
_TORCH_NAMES = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "F32": ("float32", 4),
    "C32": ("complex32", 4),
    "C64": ("complex64", 8),
    "F64": ("float64", 8),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "C128": ("complex128", 16),
}

TORCH_DTYPES: dict[str, torch.dtype] = {}
for _name, (_attr, _size) in _TORCH_NAMES.items():
    _dt = getattr(torch, _attr, None)
    if isinstance(_dt, torch.dtype):
        TORCH_DTYPES[_name] = _dt
DTYPE_SIZES = {name: size for name, (_, size) in _TORCH_NAMES.items()}
# torch dtype -> safetensors name (for writing).
TORCH_TO_NAME = {dt: name for name, dt in TORCH_DTYPES.items()}

NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16, "F16": np.float16,
    "I32": np.int32, "U32": np.uint32, "F32": np.float32, "C64": np.complex64, "F64": np.float64,
    "I64": np.int64, "U64": np.uint64, "C128": np.complex128,
}


def nbytes(dtype: str, shape) -> int:
    """Bytes of a listed tensor (its dtype's name, its shape); a dtype this
    table does not size counts a byte per element."""
    n = DTYPE_SIZES.get(dtype, 1)
    for d in shape:
        n *= int(d)
    return n


def raw_dtypes_default() -> bool:
    return os.environ.get("WEIGHTLIFT_RAW_DTYPES", "") not in ("", "0", "false", "False")


def _unsupported(dtype: str, name: str, file: str | None, what: str) -> TypeError:
    where = f"{file}: " if file else ""
    return TypeError(
        f"{where}tensor '{name}': dtype {dtype} has no {what} equivalent"
        + (f" in torch {torch.__version__}" if what == "torch" else "")
        + " (set WEIGHTLIFT_RAW_DTYPES=1 to get its bytes as uint8)"
    )


# Test seam (set by _gpu.py, only under the fake GPU backend): a function
# that copies a device array to the host; device arrays are then handed over
# as host copies, for a torch without CUDA (see _gpu.test_seam_device).
DEVICE_ARRAYS_TO_HOST = None
_KDLCUDA = 2


def _dlpack_device_type(data) -> int:
    """The DLPack device type of an array or a 'dltensor' capsule (DLManagedTensor
    starts with DLTensor {void* data; DLDevice {int32 type; int32 id}; ...})."""
    if hasattr(data, "__dlpack_device__"):
        return int(data.__dlpack_device__()[0])
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ctypes.c_int32.from_address(get(data, b"dltensor") + ctypes.sizeof(ctypes.c_void_p)).value


def to_torch(dtype: str, shape, data, name: str = "", file: str | None = None, raw_dtypes: bool | None = None):
    """A torch tensor over `data` (1-D uint8 array) of the given dtype and shape, zero-copy."""
    if DEVICE_ARRAYS_TO_HOST is not None and _dlpack_device_type(data) == _KDLCUDA:
        data = DEVICE_ARRAYS_TO_HOST(data)
    t = _dlpack.from_dlpack(data)
    tdt = TORCH_DTYPES.get(dtype)
    shape = tuple(shape)
    if tdt is None:
        if raw_dtypes is None:
            raw_dtypes = raw_dtypes_default()
        size = DTYPE_SIZES.get(dtype)
        if not raw_dtypes or size is None:
            raise _unsupported(dtype, name, file, "torch")
        return t.view(shape + (size,))
    if tdt is not torch.uint8:
        t = t.view(tdt)
    return t.view(shape)


def to_numpy(dtype: str, shape, data, name: str = "", file: str | None = None, writable: bool = False):
    """A numpy array over `data`, zero-copy; read-only unless `writable`."""
    ndt = NUMPY_DTYPES.get(dtype)
    if ndt is None:
        raise _unsupported(dtype, name, file, "numpy")
    a = _dlpack.from_dlpack(data).numpy()
    if not writable:
        a.flags.writeable = False
    return a.view(ndt).reshape(tuple(shape))


def tensor_bytes(t: torch.Tensor):
    """(dtype name, shape, 1-D uint8 numpy array over the bytes) of a CPU tensor, for writing."""
    name = TORCH_TO_NAME.get(t.dtype)
    if name is None:
        raise TypeError(f"dtype {t.dtype} cannot be stored in safetensors")
    t = t.detach().cpu().contiguous()
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return name, list(t.shape), np.zeros(0, dtype=np.uint8)
    u8 = flat.view(torch.uint8) if t.dtype is not torch.bool else flat.view(torch.uint8)
    return name, list(t.shape), u8.numpy()
