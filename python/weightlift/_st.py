"""A `safetensors`-compatible surface over the C++ reader and writer:
safe_open / load_file / load / save_file behave like the `safetensors`
package's (same names, arguments and results), backed by weightlift.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from . import _core, _gpu
from ._tensors import tensor_bytes, to_numpy, to_torch

_FRAMEWORKS = ("pt", "torch", "pytorch", "np", "numpy")


def _fspath(path) -> str:
    return os.fspath(path)


class safe_open:  # noqa: N801 - the safetensors name
    """Opens a .safetensors file: keys(), metadata(), get_tensor(), get_slice().

    framework="pt": zero-copy torch tensors over a private copy-on-write
    mapping of the file (lazy; writable, a write never reaches the file), or,
    with strategy="eager", over one buffer holding the whole file.
    framework="np": numpy arrays over the same memory, writable (as
    safetensors 0.8's are; a write never reaches the file).
    device: "cpu"; "cuda"/"cuda:N" (read into device memory through the pinned
    staging ring, without touching the mapping); any other torch device (the
    tensor is copied there).
    """

    def __init__(self, filename, framework: str = "pt", device: Any = "cpu", strategy: str = "lazy",
                 raw_dtypes: bool | None = None, *, backend: str = "mmap"):
        if framework not in _FRAMEWORKS:
            raise ValueError(f"framework {framework!r} is not supported (expected 'pt' or 'np')")
        if backend not in ("mmap", "pread"):
            raise ValueError(f"backend {backend!r} is not supported (expected 'mmap' or 'pread')")
        if backend == "pread" and strategy == "lazy":
            strategy = "eager"  # bytes read with pread(2) instead of mapped
        self._np = framework in ("np", "numpy")
        self._device = device
        self._raw = raw_dtypes
        self._f = _core.SafetensorsFile(_fspath(filename), strategy)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f = None
        return False

    @property
    def path(self) -> str:
        return self._f.path

    def keys(self) -> list[str]:
        """Tensor names, sorted (as safetensors' keys())."""
        return self._f.names()

    def offset_keys(self) -> list[str]:
        """Tensor names in file (offset) order."""
        return [t[0] for t in self._f.tensors()]

    def metadata(self) -> dict[str, str] | None:
        md = self._f.metadata()
        return md if md else None

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, as a dict in offset order (safetensors 0.8's get_tensors)."""
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def _wrap(self, name, dtype, shape, data):
        if self._np:
            return to_numpy(dtype, shape, data, name, self._f.path, writable=True)
        t = to_torch(dtype, shape, data, name, self._f.path, self._raw)
        if self._device not in ("cpu", None) and str(self._device) != "cpu":
            t = t.to(self._device)
        return t

    def get_tensor(self, name: str):
        if not self._np and _gpu._is_cuda(self._device):  # straight to the device, not through the mapping
            return _gpu.safetensors_tensor_to_device(self._f, name, self._device, self._raw)
        try:
            dtype, shape, data = self._f.get(name)
        except FileNotFoundError as e:
            raise KeyError(str(e)) from None
        return self._wrap(name, dtype, shape, data)

    def get_slice(self, name: str) -> SafeSlice:
        info = self._f.info(name)
        if info is None:
            raise KeyError(f"{self._f.path}: no tensor named '{name}'")
        return SafeSlice(self, name, info[0], info[1])


class SafeSlice:
    """A tensor not read yet: get_shape(), get_dtype(), and indexing that reads
    only the bytes it needs when one dim is cut by a step-1 slice (rows: one
    range; other dims: strided runs, the engine's slice layout)."""

    def __init__(self, f: safe_open, name: str, dtype: str, shape):
        self._f, self._name, self._dtype, self._shape = f, name, dtype, list(shape)

    def get_shape(self) -> list[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def _cut(self, index: tuple):
        """(dim, begin, end, rest) when index cuts one dim with a step-1 slice
        and leaves the dims before it whole; else None."""
        if any(i is Ellipsis or i is None for i in index) or len(index) > len(self._shape):
            return None
        for d, i in enumerate(index):
            if not isinstance(i, slice):
                return None
            if i == slice(None):
                continue
            if i.step not in (None, 1):
                return None
            begin, end, _ = i.indices(self._shape[d])
            return d, begin, max(end, begin), index[:d] + (slice(None),) + index[d + 1:]
        return None

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        cut = self._cut(index) if self._shape else None
        if cut is not None:
            d, begin, end, rest = cut
            t = self._f._wrap(self._name, *self._f._f.read_slice(self._name, d, begin, end))
            return t[rest] if any(not (isinstance(i, slice) and i == slice(None)) for i in rest) else t
        return self._f.get_tensor(self._name)[index]


def load_file(filename, device: Any = "cpu", strategy: str = "lazy") -> dict[str, torch.Tensor]:
    """All tensors of a file, as safetensors.torch.load_file (sorted names)."""
    with safe_open(filename, framework="pt", device=device, strategy=strategy) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def save_file(tensors: dict[str, torch.Tensor], filename, metadata: dict[str, str] | None = None) -> None:
    """Writes a .safetensors file atomically (the same bytes safetensors writes).

    Tensors that share memory are refused (as safetensors does)."""
    seen: dict[tuple[int, int], str] = {}
    items = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"tensor '{name}' is a {type(t).__name__}, not a torch.Tensor")
        if t.numel() and t.device.type == "cpu":
            key = (t.data_ptr(), t.numel() * t.element_size())
            if key in seen:
                raise RuntimeError(
                    f"tensors '{seen[key]}' and '{name}' share memory; save one of them (or clone it)")
            seen[key] = name
        items.append((name, *tensor_bytes(t)))
    _core.write_safetensors(_fspath(filename), items, dict(metadata or {}))
