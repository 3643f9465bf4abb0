"""The core of the `safetensors` package's API, over weightlift's engine:
safe_open (with prefetch and get_tensor_meta), _safe_open_handle,
PySafeSlice, TensorMeta, PrefetchLoader, serialize, serialize_file,
deserialize, TensorSpec and SafetensorError, with safetensors 0.9's
signatures, defaults, results, exception classes and messages (0.8's, which
0.9 keeps, included).

Reads go through the bridge to the engine (_engine.py), in its words: a
handle is the engine's "lazy" read of one file (with file views for
backend="mmap", without for "pread") or its "eager" one. Every read into a
CUDA device goes through the engine's pinned staging ring into device memory
the engine allocates (never torch's .to() from the mapping): prefetch and a
"cuda" handle's get_tensors are the engine's device stream of the file
(_st_prefetch.py); a "cuda" handle's get_tensor and get_slice read that one
tensor (or its rows) from the open handle through the same ring, without
planning the whole file again.

Users import it as weightlift.safetensors (and its .torch / .numpy modules,
which mirror safetensors.torch / safetensors.numpy); weightlift.safe_open is
the same class.

Errors. Every error safetensors raises as SafetensorError is a
SafetensorError here, with safetensors' wording (the engine's message, which
names the file and tensor, follows it). Each is also an instance of the
standard class weightlift raised before this module mirrored safetensors, so
both kinds of `except` keep working:
  SafetensorValueError(SafetensorError, ValueError)    bad argument, value safetensors cannot store
  SafetensorCorruptError(SafetensorError, CorruptDataError)  a file or buffer that violates the format
  SafetensorKeyError(SafetensorError, KeyError)        no tensor of that name
  SafetensorOSError(SafetensorError, OSError)          an I/O failure while reading or writing
A missing file is FileNotFoundError("No such file or directory: NAME"), as in safetensors.

Memory. framework="pt" and "np" tensors are zero-copy views of a private
copy-on-write mapping of the file (backend="mmap"): writable, a write never
reaches the file, and two get_tensor() calls for one name on one handle see
the same memory (as safetensors' torch tensors do; its numpy arrays are
copies). backend="pread" reads each tensor into a fresh buffer.
"""
from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np
import torch

from . import _engine
from ._engine import CorruptDataError
from ._st_prefetch import PrefetchLoader, parse_plan, planned, reader_threads
from ._tensors import DTYPE_SIZES, TORCH_DTYPES, raw_dtypes_default, to_numpy, to_torch

__all__ = [
    "SafetensorError", "SafetensorValueError", "SafetensorCorruptError", "SafetensorKeyError",
    "SafetensorOSError", "TensorSpec", "TensorMeta", "safe_open", "_safe_open_handle", "PySafeSlice", "SafeSlice",
    "PrefetchLoader", "PrefetchPlan", "serialize", "serialize_file", "deserialize", "__version__",
]

# The safetensors release whose API this module mirrors, as that release
# spells it (0.9.0rc1's module says its Cargo version; PEP 440 reads it as 0.9.0rc1).
__version__ = "0.9.0-rc.1"

_PUBLIC = "weightlift.safetensors"

SafetensorError = _engine.SafetensorError
TensorSpec = _engine.TensorSpec
TensorSpec.__module__ = _PUBLIC
# A tensor's header entry (safetensors 0.9): dtype, shape, data_offsets within the data section.
TensorMeta = _engine.TensorMeta
TensorMeta.__module__ = _PUBLIC

# safe_open.prefetch's plan: tensor name -> None (the whole tensor) or a step-1 slice of its first dimension.
PrefetchPlan = dict[str, "slice | None"]


class SafetensorValueError(SafetensorError, ValueError):
    """A bad argument, or a value safetensors cannot store (also a ValueError)."""


class SafetensorCorruptError(SafetensorError, CorruptDataError):
    """A file or buffer whose bytes violate the safetensors format (also a CorruptDataError, a ValueError)."""


class SafetensorKeyError(SafetensorError, KeyError):
    """No tensor of that name in the file (also a KeyError)."""

    __str__ = BaseException.__str__  # the message, not KeyError's repr of it


class SafetensorOSError(SafetensorError, OSError):
    """An I/O failure while reading or writing (also an OSError)."""


for _cls in (SafetensorValueError, SafetensorCorruptError, SafetensorKeyError, SafetensorOSError):
    _cls.__module__ = _PUBLIC


def _translate(e: BaseException, prefix: str) -> BaseException:
    """The SafetensorError subclass for an engine error, worded `prefix + engine message`."""
    msg = prefix + str(e)
    if isinstance(e, CorruptDataError):
        return SafetensorCorruptError(msg)
    if isinstance(e, (ValueError, TypeError)):
        return SafetensorValueError(msg)
    if isinstance(e, OSError):
        return SafetensorOSError(msg)
    return SafetensorError(msg)


def _closed() -> SafetensorValueError:
    return SafetensorValueError("File is closed")


# ---- arguments ------------------------------------------------------------------------------

_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}
_OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle")
_ACCELERATORS = ("cuda", "musa", "npu", "xpu", "xla", "mlu", "hpu")


def _framework(framework) -> str:
    fw = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if fw is None:
        if framework in _OTHER_FRAMEWORKS:
            raise SafetensorValueError(f"framework {framework} is not supported by weightlift (use pt or numpy)")
        raise SafetensorValueError(f"framework {framework} is invalid")
    return fw


def _device(device) -> str:
    """safetensors' device argument, normalized: "cpu", "cuda:N", "mps", "npu:N", ...
    An int is the default accelerator's index (torch decides which, as for tensor.to(N))."""
    if device is None:
        return "cpu"
    if isinstance(device, torch.device):  # accepted here, refused by safetensors 0.8 and 0.9
        device = str(device)
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise SafetensorValueError(f"device {device!r} is invalid")
    if isinstance(device, int):
        if device < 0:
            raise SafetensorValueError(f"device {device} is invalid")
        try:
            return str(torch.device(device))
        except (RuntimeError, ValueError):
            return f"cuda:{device}"
    if device == "cpu":
        return "cpu"
    if device in ("mps", "mps:0"):
        return "mps"
    kind, sep, index = device.partition(":")
    if kind in _ACCELERATORS:
        if not sep:
            return f"{kind}:0"
        if index.isdigit():
            return f"{kind}:{int(index)}"
    if kind == "mps" and index.isdigit():
        raise SafetensorValueError(f"device {device} is invalid: only mps or mps:0 is supported")
    raise SafetensorValueError(f"device {device} is invalid")


def _open_file(filename, strategy: str, file_views: bool):
    path = os.fspath(filename)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    try:
        return _engine.safetensors_file(path, strategy, file_views)
    except FileNotFoundError:
        raise FileNotFoundError(f"No such file or directory: {path}") from None
    except (CorruptDataError, ValueError) as e:
        if isinstance(e, CorruptDataError):
            raise SafetensorCorruptError(f"Error while deserializing header: {e}") from None
        raise SafetensorValueError(str(e)) from None


# ---- tensors ----------------------------------------------------------------------------------

_F4 = getattr(torch, "float4_e2m1fn_x2", None)

# safetensors dtype -> the numpy dtype its arrays are views of (what numpy has).
_NP_DIRECT = {name: np.dtype(t) for name, t in (
    ("BOOL", np.bool_), ("U8", np.uint8), ("I8", np.int8), ("I16", np.int16), ("U16", np.uint16),
    ("F16", np.float16), ("I32", np.int32), ("U32", np.uint32), ("F32", np.float32), ("C64", np.complex64),
    ("F64", np.float64), ("I64", np.int64), ("U64", np.uint64))}


def _f4_shape(shape) -> list:
    """torch's shape of a float4_e2m1fn_x2 tensor (two values a byte: the last dim halves)."""
    if not shape or shape[-1] % 2:
        raise SafetensorValueError(f"f4_x2 dtype requires the last dim be divisible by 2 in torch: got {list(shape)}")
    return list(shape[:-1]) + [shape[-1] // 2]


def _torch_tensor(dtype: str, shape, data, name: str, path: str, raw):
    if dtype == "F4" and _F4 is not None:
        return to_torch("U8", _f4_shape(shape), data).view(_F4)
    return to_torch(dtype, shape, data, name, path, raw)


def _torch_has(dtype: str, raw) -> bool:
    """Whether this torch hands out `dtype` (its own dtype, or, with raw dtypes, its bytes)."""
    if dtype == "F4":
        return _F4 is not None
    if dtype in TORCH_DTYPES:
        return True
    return (raw_dtypes_default() if raw is None else bool(raw)) and dtype in DTYPE_SIZES




class safe_open:  # noqa: N801 - the safetensors name
    """Opens a safetensors file lazily and returns tensors as asked
    (safetensors.safe_open, 0.9).

    filename: str or os.PathLike. framework: "pt" (torch, pytorch) or "np"
    (numpy); weightlift does not convert to TensorFlow, Flax, MLX or Paddle.
    device: "cpu" (default), "cuda", "cuda:N", an int (the default
    accelerator's index), a torch.device, or any device torch knows ("mps",
    "npu:0", ...). CUDA tensors are read by the engine straight into device
    memory through its pinned staging ring (never through the mapping), the
    ring prefetch() stages through; other devices' tensors are read on the
    CPU and moved.
    backend: "mmap" (default; zero-copy views of a private copy-on-write
    mapping) or "pread" (each tensor read into a fresh buffer).

    weightlift's own keywords: strategy="eager" reads the whole file into
    one buffer at open; raw_dtypes=True returns tensors whose dtype this
    torch lacks (float8 on torch < 2.1, ...) as their bytes (uint8).

    Use it in a `with` block: after it, every method raises SafetensorError
    ("File is closed"); tensors already returned, and loaders started, stay
    valid. One handle may be used from many threads at once.
    """

    __slots__ = ("_f", "_np", "_fw", "_device", "_cuda", "_cuda_ready", "_raw", "_mapped", "_keys", "_header",
                 "_base")

    def __init__(self, filename, framework: str = "pt", device: Any = "cpu", *, backend: str = "mmap",
                 strategy: str | None = None, raw_dtypes: bool | None = None):
        self._f = None
        fw = _framework(framework)
        dev = _device(device)
        if backend not in ("mmap", "pread"):
            raise SafetensorValueError(
                f'backend {_rust_str(backend)} is invalid (expected one of: "mmap", "pread")')
        if fw == "np" and dev != "cpu":
            raise SafetensorValueError(f"Device {dev} is not supported for framework numpy")
        if strategy is not None and (strategy not in ("lazy", "eager") or backend == "pread"):
            raise SafetensorValueError(
                f"strategy {strategy!r} is invalid (expected 'lazy' or 'eager', with backend='mmap')")
        # The engine's words: lazy with file views (mmap), lazy without (pread), eager.
        strategy = strategy or "lazy"
        file_views = backend == "mmap" and strategy == "lazy"
        self._np = fw == "np"
        self._fw = fw
        self._device = dev
        self._cuda = dev.startswith("cuda")
        self._cuda_ready = False
        self._raw = raw_dtypes
        self._mapped = backend == "mmap"
        self._keys = None
        self._header = None
        self._base = None
        self._f = _open_file(filename, strategy, file_views)

    # -- lifetime
    def __enter__(self):
        return self

    def __exit__(self, exc_type=None, exc_value=None, traceback=None):
        self._f = None
        return None

    def _file(self):
        f = self._f
        if f is None:
            raise _closed()
        return f

    # -- the header
    @property
    def path(self) -> str:
        return self._file().path

    def keys(self) -> list[str]:
        """Tensor names, sorted."""
        f = self._file()
        if self._keys is None:
            self._keys = f.names()
        return list(self._keys)

    def offset_keys(self) -> list[str]:
        """Tensor names in file (offset) order."""
        return self._file().offset_names()

    def metadata(self) -> dict[str, str] | None:
        """The header's "__metadata__" map (None when there is none)."""
        md = self._file().metadata()
        return md if md else None

    def get_tensor_meta(self, name: str) -> TensorMeta:
        """`name`'s header entry (dtype, shape, data_offsets) without reading
        any data. Works on every backend."""
        f = self._f
        if f is None:
            raise _closed()
        meta = f.meta(name)
        if meta is None:
            raise SafetensorKeyError(f"File does not contain tensor {name}")
        return meta

    def _header_of(self, f) -> dict[str, tuple[str, list[int], int]]:
        """name -> (dtype, shape, nbytes), in file (offset) order."""
        if self._header is None:
            self._header = {n: (dtype, shape, nbytes) for n, dtype, shape, _, nbytes in f.tensors()}
        return self._header

    # -- tensors
    def _finish(self, name: str, t, f):
        """A typed() result made the handle's tensor: (dtype, shape, bytes) of a
        dtype the C++ side does not hand over directly reinterpreted here, then
        moved to the handle's (non-CUDA) device."""
        if type(t) is tuple:
            dtype, shape, data = t
            if self._np:
                return to_numpy(dtype, shape, data, name, f.path, writable=True)
            t = _torch_tensor(dtype, shape, data, name, f.path, self._raw)
        if self._device != "cpu":
            t = t.to(self._device)
        return t

    def _typed(self, f, name: str, hint: bool = True):
        try:
            t = f.typed(name, self._fw, hint)
        except OSError as e:
            raise SafetensorOSError(f"Could not read tensor {name} from file: {e}") from None
        if t is None:
            raise SafetensorKeyError(f"File does not contain tensor {name}")
        return t

    def _np_base(self, f):
        """The mapped file as one uint8 array (numpy arrays are slices of it), or False."""
        if self._base is None:
            base = f.mapping() if self._mapped else None
            self._base = False if base is None else base
        return self._base

    def _np_array(self, f, name: str, loc):
        b, e, dtype, shape = loc
        ndt = _NP_DIRECT.get(dtype)
        base = self._base if self._base is not None else self._np_base(f)
        if ndt is None or base is False:
            return self._finish(name, self._typed(f, name), f)
        return base[b:e].view(ndt).reshape(shape)

    def get_tensor(self, name: str):
        """The whole tensor `name`, in the handle's framework and on its device."""
        f = self._f
        if f is None:
            raise _closed()
        if self._np and self._mapped:
            loc = f.locate(name, True)
            if loc is None:
                raise SafetensorKeyError(f"File does not contain tensor {name}")
            return self._np_array(f, name, loc)
        if self._cuda:
            return self._device_tensor(f, name, None)
        t = self._typed(f, name)
        if type(t) is tuple or self._device != "cpu":
            t = self._finish(name, t, f)
        return t

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, as a dict in file (offset) order; to a CUDA device in
        one engine load (reads overlapping the copies through the pinned ring,
        one device allocation), as load_file does, not a read per tensor."""
        f = self._file()
        if self._cuda:
            with self._device_loader(f, None, self._device, 0, strict=False) as loader:
                landed = dict(loader)  # as they land; then in file order
                return {n: landed[n] for n in loader.names()}
        if self._np and self._mapped:
            arr = self._np_array
            return {loc[0]: arr(f, loc[0], loc[1:]) for loc in f.locate_all(True)}
        try:
            items = f.typed_all(self._fw)
        except OSError as e:
            raise SafetensorOSError(f"Could not read tensor from file: {e}") from None
        if self._device == "cpu" and not any(type(t) is tuple for _, t in items):
            return dict(items)
        finish = self._finish
        return {name: finish(name, t, f) for name, t in items}

    def get_slice(self, name: str) -> PySafeSlice:
        """A tensor not read yet: get_shape(), get_dtype(), and indexing."""
        f = self._f
        if f is None:
            raise _closed()
        loc = f.locate(name)
        if loc is None:
            raise SafetensorKeyError(f"File does not contain tensor {name}")
        return PySafeSlice(self, f, name, loc)

    # -- CUDA: the engine's device stream
    def prefetch(self, plan: PrefetchPlan | None = None, *, device: Any = None, threads: int = 8) -> PrefetchLoader:
        """Starts loading the file's tensors to a CUDA device in the background
        (safetensors 0.9): a PrefetchLoader that hands each tensor out once, by
        take(name) or by iterating it as (name, tensor) in readiness order, as
        zero-copy views of device memory. The handle is unchanged; several
        loaders may be started from it. framework="pt", either backend.

        plan: {name: None (the whole tensor) or a step-1 slice of its first
        dimension}; tensors absent from it are not loaded; None loads every
        tensor whole. device: the CUDA device (default: the handle's).
        threads: the engine's reader threads for this loader (1..64). Every
        loader of the process stages through the engine's one pinned ring.
        Raises SafetensorError, before any device work, for a dtype torch
        cannot represent (F6), a step other than 1, a 0-d sliced tensor.
        """
        if plan is not None and not isinstance(plan, dict):
            raise TypeError(f"argument 'plan': '{type(plan).__name__}' object is not an instance of 'dict'")
        dev = None if device is None else _device(device)
        n_threads = reader_threads(threads)
        f = self._file()
        if self._fw != "pt":
            raise SafetensorError('prefetch is only compatible with framework="pt"')
        dev = self._device if dev is None else dev
        if not dev.startswith("cuda:"):
            raise SafetensorError(f"prefetch loads to cuda devices, not {dev}")
        rows_of = None if plan is None else parse_plan(plan, self._header_of(f))
        return self._device_loader(f, rows_of, dev, n_threads, strict=True, what="prefetch")

    def _device_loader(self, f, rows_of, device: str, threads: int, *, strict: bool,
                       what: str = "safe_open(device=...)") -> PrefetchLoader:
        """A loader of the planned tensors ({name: None | (begin, end)}, None:
        all) on `device` ("cuda:N"). strict: refuse dtypes torch lacks now (as
        prefetch does), else let the tensor's conversion raise as get_tensor's does."""
        header = self._header_of(f)
        raw = self._raw
        has = (lambda dtype: _torch_has(dtype, raw)) if strict else (lambda dtype: True)
        items = planned(rows_of, list(header), header, has)
        from . import _gpu

        try:
            dev = _gpu._device_name(device, what)  # CUDA there (or the test seam), or why not
        except (RuntimeError, ValueError) as e:
            if not strict:
                raise  # get_tensor & co.: the RuntimeError every device door raises
            raise SafetensorError(str(e)) from None  # prefetch: safetensors 0.9's class
        path = f.path
        try:
            stream = _engine.device_stream(path, dev, only=[n for n, _ in items], threads=threads,
                                           rows={n: r for n, r in items if r is not None})
        except (ValueError, OSError, RuntimeError) as e:
            raise _translate(e, "") from None
        return PrefetchLoader._start(
            stream, [n for n, _ in items],
            lambda name, dtype, shape, data: _torch_tensor(dtype, shape, data, name, path, raw))

    def _device_tensor(self, f, name: str, rows: tuple[int, int] | None):
        """One tensor (or rows [begin, end) of it) read into the handle's CUDA
        device through the engine's pinned ring, from the open handle."""
        if not f.__contains__(name):
            raise SafetensorKeyError(f"File does not contain tensor {name}")
        if not self._cuda_ready:
            from . import _gpu

            self._device = _gpu._device_name(self._device, "safe_open(device=...)")  # CUDA there, or why not
            self._cuda_ready = True
        try:
            dtype, shape, data = _engine.tensor_to_device(f, name, rows, self._device)
        except OSError as e:
            raise SafetensorOSError(f"Could not read tensor {name} from file: {e}") from None
        return _torch_tensor(dtype, shape, data, name, f.path, self._raw)


class _safe_open_handle(safe_open):  # noqa: N801 - the safetensors name
    """safe_open over an open Python file object (it needs `fileno()` and a
    `name`): safetensors' _safe_open_handle (0.8, 0.9), which opens the file by that name."""

    __slots__ = ()

    def __init__(self, f, framework: str = "pt", device: Any = "cpu", *, backend: str = "mmap", **kwargs):
        f.fileno  # noqa: B018 - AttributeError for objects that are not files, as safetensors
        name = f.name
        if not isinstance(name, (str, bytes, os.PathLike)):
            raise TypeError(f"argument 'f': its name is a {type(name).__name__}, not a path")
        super().__init__(name, framework, device, backend=backend, **kwargs)


def _rust_str(s) -> str:
    """A string as Rust's {:?} prints it."""
    if not isinstance(s, str):
        return repr(s)
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- slices -------------------------------------------------------------------------------------

class PySafeSlice:
    """A tensor not read yet (safetensors' PySafeSlice, returned by
    safe_open.get_slice): get_shape(), get_dtype(), and indexing with ints,
    slices (positive steps) and one ellipsis.

    Indexing follows safetensors 0.9 (and 0.8): with framework="pt" and the mmap
    backend, it is torch's own indexing of a view of the mapped tensor
    (anything torch accepts); with "np", or with backend="pread", it is
    safetensors' indexer (ints, slices with positive steps, `...`, an empty
    list), out-of-range bounds raising SafetensorError "Error during slicing
    ...". It departs from safetensors where safetensors crashes: negative
    slice bounds count from the end, a slice that ends before it starts is
    empty, and `[:]` of a zero-length dimension is empty. The slice stays
    usable after its handle is closed, as safetensors' does.

    On a CUDA handle the engine reads the rows of the first dimension the
    index keeps (when its first item is an int or a step-1 slice; else the
    whole tensor) straight into device memory, where the rest of the index
    is applied.
    """

    __slots__ = ("_h", "_f", "_name", "_loc")

    def __init__(self, handle: safe_open, f, name: str, loc):
        self._h, self._f, self._name, self._loc = handle, f, name, loc  # loc: (begin, end, dtype, shape)

    def get_shape(self) -> list[int]:
        return list(self._loc[3])

    def get_dtype(self) -> str:
        return self._loc[2]

    def __getitem__(self, index):
        h = self._h
        if h._cuda:
            return self._on_device(index)
        if h._np and h._mapped and type(index) is slice:
            rows = self._np_rows(index)  # the common case, without the general indexer
            if rows is not None:
                return rows
        if not h._np and h._mapped:
            t = h._typed(self._f, self._name, False)
            if type(t) is tuple:
                dtype, shape, data = t
                t = _torch_tensor(dtype, shape, data, self._name, self._f.path, h._raw)
            t = t[index]
            if h._device != "cpu":
                t = t.to(h._device)
            return t
        return self._indexed(_indexers(index, self._loc[3]))

    def _on_device(self, index):
        h, shape = self._h, self._loc[3]
        if not h._mapped:  # safetensors' indexer: its checks and its errors first
            idx = _indexers(index, shape)
            _check_bounds(idx, shape)
            index = tuple(slice(i[0], i[1], i[2]) if len(i) == 3 else i[0] for i in idx)
        rows, rest = _dim0_rows(index, shape)
        t = h._device_tensor(self._f, self._name, rows)[rest]
        return t if h._mapped else t.contiguous()

    def _np_rows(self, index: slice):
        """Rows [start:stop] (step 1) of a mapped numpy tensor: a view of the
        mapping, contiguous as it is; None where the general path must decide."""
        b, e, dtype, shape = self._loc
        if not shape or not shape[0] or index.step not in (None, 1):
            return None
        start, stop, n = index.start, index.stop, shape[0]
        if not (start is None or type(start) is int) or not (stop is None or type(stop) is int):
            return None
        start = 0 if start is None else (max(start + n, 0) if start < 0 else start)
        stop = n if stop is None else (max(stop + n, 0) if stop < 0 else stop)
        ndt = _NP_DIRECT.get(dtype)
        base = self._h._base if self._h._base is not None else self._h._np_base(self._f)
        if start > n or stop > n or ndt is None or base is False:
            return None
        stop = max(stop, start)
        row = (e - b) // n
        return base[b + start * row:b + stop * row].view(ndt).reshape([stop - start] + shape[1:])

    def _indexed(self, idx):
        h, f, shape = self._h, self._f, self._loc[3]
        _check_bounds(idx, shape)
        py = tuple(slice(i[0], i[1], i[2]) if len(i) == 3 else i[0] for i in idx)
        cut = None if h._mapped else _one_cut(idx, shape)
        if cut is not None:  # pread: read only the rows (or runs) that the index keeps
            d, begin, end = cut
            t = f.read_slice(self._name, d, begin, end)
            py = py[:d] + (slice(None),) + py[d + 1:]
        elif h._np:
            t = h._np_array(f, self._name, self._loc)
        else:
            t = h._typed(f, self._name, False)
        if type(t) is tuple:
            dtype, sshape, data = t
            t = (to_numpy(dtype, sshape, data, self._name, f.path, writable=True) if h._np
                 else _torch_tensor(dtype, sshape, data, self._name, f.path, h._raw))
        if h._np:
            return np.ascontiguousarray(t[py])
        t = t[py].contiguous()
        if h._device != "cpu":
            t = t.to(h._device)
        return t


SafeSlice = PySafeSlice  # weightlift's name for it before safetensors 0.9 exported one
PySafeSlice.__module__ = _PUBLIC


def _dim0_rows(index, shape) -> tuple[tuple[int, int] | None, Any]:
    """(rows, rest): the rows [begin, end) of dim 0 an index keeps when its
    first item is an int or a step-1 slice of ints (None: every row), and the
    index that gives the result from those rows."""
    items = index if isinstance(index, tuple) else (index,)
    if not shape or not items:
        return None, index
    first, n = items[0], shape[0]
    if type(first) is slice and first.step in (None, 1) and \
            all(b is None or type(b) is int for b in (first.start, first.stop)):
        start, stop, _ = first.indices(n)
        return (start, max(start, stop)), (slice(None),) + items[1:]
    if type(first) is int and -n <= first < n:
        i = first + n if first < 0 else first
        return (i, i + 1), (0,) + items[1:]
    return None, index


def _indexers(index, shape) -> list[tuple]:
    """safetensors' parse_indexers: each dim's (start, stop, step) of a slice or
    (i,) of an int, resolved against `shape` (None for an open bound)."""
    if isinstance(index, tuple):
        items = list(index)
    elif isinstance(index, list):
        if not index:
            return [(0, 0, 1)]
        raise SafetensorValueError("Non empty lists are not implemented")
    else:
        items = [index]
    n_ellipsis = sum(1 for it in items if it is Ellipsis)
    if n_ellipsis > 1:
        raise SafetensorValueError("Only one ellipsis (...) is allowed in slice index")
    expand = max(len(shape) - (len(items) - n_ellipsis), 0)
    out: list[tuple] = []
    for it in items:
        d = len(out)
        dim = shape[d] if d < len(shape) else 0
        if it is Ellipsis:
            out.extend([(None, None, 1)] * expand)
        elif isinstance(it, slice):
            step = 1 if it.step is None else operator.index(it.step)
            if step <= 0:
                raise SafetensorValueError(f"Slice step must be a positive integer, got {step}")
            out.append((_bound(it.start, dim), _bound(it.stop, dim), step))
        else:
            try:
                i = operator.index(it)
            except TypeError:
                raise SafetensorValueError(
                    f"Unsupported slice index at position {d}: expected slice, int, or ellipsis") from None
            if i < 0:
                if i + dim < 0:
                    raise SafetensorValueError(f"Invalid index {i} for dimension {d} of size {dim}")
                i += dim
            out.append((i,))
    return out


def _bound(b, dim: int):
    if b is None:
        return None
    b = operator.index(b)
    return max(b + dim, 0) if b < 0 else b


def _disp(idx) -> str:
    parts = []
    for i in idx:
        if len(i) == 1:
            parts.append(str(i[0]))
        else:
            s = f"{'' if i[0] is None else i[0]}:{'' if i[1] is None else i[1]}"
            parts.append(s if i[2] == 1 else f"{s}:{i[2]}")
    return "[" + ", ".join(parts) + "]"


def _check_bounds(idx, shape) -> None:
    """safetensors' slice_byte_ranges checks (last dim first, as it walks them)."""
    def fail(why: str):
        raise SafetensorValueError(f"Error during slicing {_disp(idx)} with shape {list(shape)}: {why}")

    if len(idx) > len(shape):
        fail("more slicing indexes than dimensions in tensor")
    for d in range(len(idx) - 1, -1, -1):
        i, dim = idx[d], shape[d]
        if len(i) == 1:
            if i[0] >= dim:
                fail(f"index {i[0]} out of bounds for tensor dimension #{d} of size {dim}")
            continue
        start = 0 if i[0] is None else i[0]
        stop = dim if i[1] is None else i[1]
        if start > dim or stop > dim:
            asked = start if start > dim else stop - 1
            fail(f"index {asked} out of bounds for tensor dimension #{d} of size {dim}")


def _one_cut(idx, shape):
    """(dim, begin, end) when the index narrows exactly one dim with step 1 and
    keeps every dim before it whole: those bytes can be read alone."""
    cut = None
    for d, i in enumerate(idx):
        if len(i) == 3 and i[2] == 1 and i[0] in (None, 0) and i[1] in (None, shape[d]):
            continue
        if cut is not None or len(i) != 3 or i[2] != 1:
            return None
        begin = 0 if i[0] is None else i[0]
        end = shape[d] if i[1] is None else i[1]
        cut = (d, begin, max(begin, end))
    return cut


# ---- the writer ---------------------------------------------------------------------------------

def serialize(tensor_dict, metadata=None) -> bytes:
    """The bytes of a safetensors file holding `tensor_dict` ({name: TensorSpec}).

    The caller keeps every TensorSpec's memory alive and unchanged during the call."""
    try:
        return _engine.serialize(tensor_dict, metadata)
    except (ValueError, OSError) as e:
        raise _translate(e, "Error while serializing: ") from None


def serialize_file(tensor_dict, filename, metadata=None) -> None:
    """Writes `tensor_dict` ({name: TensorSpec}) to `filename` (str or os.PathLike)
    atomically: a temporary beside it, renamed into place (not fsynced, as
    safetensors). The GIL is released while writing."""
    try:
        _engine.serialize_file(tensor_dict, filename, metadata)
    except (ValueError, OSError) as e:
        raise _translate(e, "Error while serializing: ") from None


def deserialize(bytes):  # noqa: A002 - safetensors' parameter name
    """[(name, {"shape": [...], "dtype": "F32", "data": bytearray})] of a whole
    file held in memory, in offset order."""
    meta, tensors = _parse(bytes)
    view = memoryview(bytes).cast("B")
    return [(name, {"shape": list(shape), "dtype": dtype, "data": bytearray(view[b:e])})
            for name, dtype, shape, b, e in tensors]


def _parse(data):
    try:
        return _engine.parse_safetensors(data)
    except (ValueError, OSError) as e:
        raise _translate(e, "Error while deserializing: ") from None


def _data_blocks(data, types: dict):
    """The tensors of a safetensors file held in memory, over one writable copy of its data:
    (copy, data start, [(name, framework dtype, dtype name, shape, begin, end)]); an unknown dtype
    raises safetensors' "Dtype not understood"."""
    _, tensors = _parse(data)
    if not tensors:
        return bytearray(), 0, []
    base = tensors[0][3]
    buf = bytearray(memoryview(data).cast("B")[base:tensors[-1][4]])
    out = []
    for name, dtype, shape, b, e in tensors:
        dt = types.get(dtype)
        if dt is None:
            raise SafetensorError(f"Dtype not understood: {dtype}")
        out.append((name, dt, dtype, shape, b, e))
    return buf, base, out
