"""safe_open(...).prefetch(): a file's tensors loading into a CUDA device in
the background and handed out once each, safetensors 0.9's PrefetchLoader,
on the engine's device path (_engine.device_stream):

  plan        {name: None | slice(start, stop)} checked as safetensors 0.9
              checks it (parse_plan), before any device work; a slice becomes
              the engine's row selection of that tensor (only those rows are
              read, copied and allocated)
  staging     the process's one pinned ring, shared by every loader and every
              other device load of the process (gpu.h)
  memory      one device allocation per loader, holding exactly the planned
              bytes; a tensor handed out is a zero-copy view of it
  hand-out    take(name) waits for that tensor; iterating yields the tensors
              not taken yet as they land; each tensor once
  frees       close() (or the end of the `with`) stops the load and lets go of
              the tensors not taken; the allocation is freed once the loader
              has let go of it (closed, or every tensor taken) and every tensor
              handed out is gone. The free is cudaFree, which waits for all
              work queued on the device (the stream current at hand-out's
              included): a consumer on any stream may drop its tensors without
              synchronizing first.

Thread-safe: one loader may be taken from and iterated by several threads
(one at a time waits in the engine; close() waits for it to get its tensor).
safe_open(device="cuda").get_tensors() is a loader of this kind (_st.py).
"""
from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _engine

SafetensorError = _engine.SafetensorError

ALREADY_DELIVERED = "tensor already delivered (prefetch hands each tensor out once, via take or iteration)"
CLOSED = "prefetch loader closed"

# Reader threads a loader may ask the engine for.
MAX_THREADS = 64


# ---- the plan ---------------------------------------------------------------------------------

def parse_plan(plan, header: dict[str, tuple[str, list[int], int]]) -> dict[str, tuple[int, int] | None]:
    """{name: None (whole) or (begin, end) rows of dim 0} of a prefetch plan,
    checked in its order with safetensors 0.9's messages. `header`: name ->
    (dtype, shape, nbytes)."""
    rows_of: dict[str, tuple[int, int] | None] = {}
    for key, value in plan.items():
        if not isinstance(key, str):
            raise SafetensorError("prefetch plan keys must be tensor names")
        name = key
        info = header.get(name)
        if info is None:
            raise SafetensorError(f"File does not contain tensor {name}")
        if value is None:
            rows_of[name] = None
            continue
        if type(value) is not slice:
            raise SafetensorError(f"prefetch plan values must be None or a slice, got {type(value)} for {name}")
        rows_of[name] = _rows(name, value, info)
    return rows_of


def _rows(name: str, s: slice, info: tuple[str, list[int], int]) -> tuple[int, int]:
    _, shape, nbytes = info
    if not shape:
        raise SafetensorError(f"cannot slice rows of the 0-d tensor {name}")
    n = shape[0]
    for attr, bound in (("start", s.start), ("stop", s.stop)):
        if bound is None:
            continue
        try:
            v = operator.index(bound)
        except TypeError:
            raise SafetensorError(f"prefetch plan slice bounds for {name} must be integers or None") from None
        if v > n or v < -n:  # Python would clamp; a plan that misses the tensor is a bug
            raise SafetensorError(f"prefetch plan slice {attr} {v} for {name} is out of range for {n} rows")
    try:
        start, stop, step = s.indices(n)
    except (TypeError, ValueError) as e:
        raise SafetensorError(f"invalid prefetch plan slice for {name}: {type(e).__name__}: {e}") from None
    if step != 1:
        raise SafetensorError(f"prefetch plan slices must have step 1, got {step} for {name}")
    row = nbytes // n if n else 0
    if row * n != nbytes:
        raise SafetensorError(f"cannot slice rows of {name}: a row is not a whole number of bytes")
    return start, max(start, stop)


def planned(rows_of: dict | None, offset_names: list[str], header: dict, torch_has: Callable[[str], bool]):
    """[(name, rows)] of the plan in file order (every tensor whole without a
    plan); SafetensorError for a dtype `torch_has` refuses (F6, which no torch
    has, or one this torch lacks), or a plan that selects nothing."""
    out = []
    for name in offset_names:
        if rows_of is None:
            rows = None
        elif name in rows_of:
            rows = rows_of[name]
        else:
            continue
        dtype = header[name][0]
        if not torch_has(dtype):
            raise SafetensorError(f"prefetch cannot hand out dtype {dtype}: torch has no matching dtype")
        out.append((name, rows))
    if rows_of is not None and not out:
        raise SafetensorError("prefetch plan selects no tensors")
    return out


def reader_threads(threads) -> int:
    """The `threads` argument as the engine's option (1..MAX_THREADS);
    TypeError / OverflowError as safetensors' binding raises them."""
    try:
        n = operator.index(threads)
    except TypeError:
        raise TypeError(f"argument 'threads': '{type(threads).__name__}' object cannot be interpreted as an "
                        "integer") from None
    if n < 0:
        raise OverflowError("argument 'threads': can't convert negative int to unsigned")
    return min(max(n, 1), MAX_THREADS)


# ---- the loader ---------------------------------------------------------------------------------

# (name, dtype, shape, bytes) -> the tensor handed out.
Convert = Callable[[str, str, list, Any], Any]


class PrefetchLoader:
    """The tensors of one file loading to a CUDA device in the background,
    returned by `safe_open.prefetch` (safetensors 0.9). Each tensor is handed
    out once, by `take` or by iterating, as a zero-copy view of device memory.
    Memory: see weightlift/_st_prefetch.py."""

    __slots__ = ("_lock", "_stream", "_names", "_planned", "_ready", "_taken", "_closed", "_error", "_convert",
                 "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError("No constructor defined for PrefetchLoader (use safe_open(...).prefetch())")

    @classmethod
    def _start(cls, stream, names: list[str], convert: Convert) -> PrefetchLoader:
        self = object.__new__(cls)
        self._lock = threading.Lock()
        self._stream = stream  # None once every tensor landed or the loader closed
        self._names = names
        self._planned = frozenset(names)
        self._ready: dict[str, tuple] = {}  # landed, not taken: name -> (dtype, shape, bytes), in landing order
        self._taken: set[str] = set()
        self._closed = False
        self._error: BaseException | None = None
        self._convert = convert
        return self

    def names(self) -> list[str]:
        """The names this loader hands out, in file order."""
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._taken)} of {len(self._names)} taken"
        return f"<PrefetchLoader: {state}>"

    # -- hand-out
    def take(self, name: str):
        """`name`'s tensor, waiting for it to land. Each tensor once, by take
        or by iterating; rows planned as a slice come back as that slice."""
        if name not in self._planned:
            raise SafetensorError(f"tensor {name} is not in the prefetch plan")
        with self._lock:
            if name in self._taken:
                raise SafetensorError(f"{name}: {ALREADY_DELIVERED}")
            raw = self._ready.pop(name, None)
            while raw is None:
                if self._closed:
                    raise SafetensorError(f"{name}: {CLOSED}")
                landed = self._land()
                if landed is None:
                    raise SafetensorError(f"{name}: {self._error or CLOSED}")
                if landed[0] == name:
                    raw = landed[1:]
                else:
                    self._ready[landed[0]] = landed[1:]
            self._hand_out(name)
        return self._convert(name, *raw)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """(name, tensor) of the tensors not taken yet, as they land."""
        return _Landing(self)

    def _next_landed(self):
        """(name, tensor) of the next tensor not taken yet, waiting for one to
        land; None when none is left. Raises the load's error or CLOSED."""
        with self._lock:
            if self._closed:
                if len(self._taken) < len(self._names):
                    raise SafetensorError(CLOSED)
                return None
            if self._ready:
                name = next(iter(self._ready))
                raw = self._ready.pop(name)
            else:
                landed = self._land()
                if landed is None:
                    if self._error is not None:
                        raise SafetensorError(str(self._error))
                    return None
                name, raw = landed[0], landed[1:]
            self._hand_out(name)
        return name, self._convert(name, *raw)

    # -- the stream (under the lock)
    def _land(self):
        """The next (name, dtype, shape, bytes) the engine hands over, or None
        once it has no more (every tensor landed, the load failed: _error, or
        the loader closed)."""
        stream = self._stream
        if stream is None:
            return None
        try:
            name, _, dtype, shape, data = next(stream)
        except StopIteration:
            self._let_go()
            return None
        except Exception as e:  # the engine's error: the load stops; tensors landed stay takeable
            self._error = e
            self._let_go()
            return None
        return name, dtype, shape, data

    def _hand_out(self, name: str) -> None:
        self._taken.add(name)
        if len(self._taken) == len(self._names):
            self._let_go()  # every tensor out: the allocation now lives as long as they do

    def _let_go(self) -> None:
        """Ends the engine's load and drops its destination (which holds the allocation)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    # -- lifetime
    def close(self) -> None:
        """Stops the background load and releases every tensor not taken yet;
        tensors already handed out keep their memory."""
        with self._lock:  # after a take() waiting in another thread got its tensor
            self._closed = True
            self._ready.clear()
            self._let_go()  # cancels the engine's load and joins its thread

    def __enter__(self) -> PrefetchLoader:
        return self

    def __exit__(self, exc_type=None, exc_value=None, traceback=None) -> None:
        self.close()


for _cls in (PrefetchLoader,):
    _cls.__module__ = "weightlift.safetensors"


class _Landing:
    """Iterator over a PrefetchLoader: (name, tensor) as they land; an error
    (the load's, or the loader closed with tensors not taken) is raised once,
    then the iterator is exhausted."""

    __slots__ = ("_loader", "_done")

    def __init__(self, loader: PrefetchLoader):
        self._loader, self._done = loader, False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            item = self._loader._next_landed()
        except BaseException:
            self._done = True
            raise
        if item is None:
            self._done = True
            raise StopIteration
        return item
