"""The one way Python starts an engine load: typed LoadOptions from keyword
arguments, and the background Stream that yields what the engine hands over.
Every iterator of the package (weight_utils, _gpu, _hub, _distributed,
_objstore) goes through these two functions."""
from __future__ import annotations

import os
from collections.abc import Iterable

from . import _core


def options(**kwargs) -> _core.LoadOptions:
    """The engine's typed options from keyword arguments (strategy, threads,
    block_size, shard_rules, local_expert_ids, max_memory, direct, order,
    file_views, device, gds, collective, ...); None leaves a default. An
    option the engine does not have is a ValueError naming it."""
    o = _core.LoadOptions()
    for key, value in kwargs.items():
        if value is None and key not in ("local_expert_ids", "collective"):
            continue
        if key == "local_expert_ids" and value is not None:
            value = set(value)
        try:
            setattr(o, key, value)
        except AttributeError:
            raise ValueError(f"the loader has no option '{key}'") from None
    return o


def open_stream(files: Iterable[str], *, max_queued_bytes: int, ordered: bool = False,
                only: Iterable[str] | None = None, exclude: Iterable[str] | None = None, **kwargs) -> _core.Stream:
    """Starts a load of `files` on an engine thread. Iterating the stream
    gives (name, file, dtype, shape, bytes) as tensors are handed over (in
    checkpoint order when `ordered`); at most `max_queued_bytes` of finished
    tensors wait for the consumer. `only`/`exclude` limit the tensors read;
    the other keywords are options()."""
    return _core.Stream([os.fspath(f) for f in files], options(**kwargs), max_queued_bytes,
                        None if only is None else list(only), None if exclude is None else list(exclude), ordered)
