"""vLLM's first garbage collection of load_model, moved to where it hides
the disk.

vLLM's load_model() runs a full gc.collect() right after load_weights()
(then process_weights_after_loading, then a second one). With vLLM
imported a full collection walks ~700,000 objects: ~0.3 s on one core,
with nothing read meanwhile. Under WeightliftModelLoader.load_model() the
checkpoint is read ahead from the start, so that collection is worth more
before load_weights(): the plug-in runs it right after construction, while
the read-ahead's threads keep the disk busy, and the call vLLM makes after
load_weights() becomes a young-generation collection (microseconds), which
frees what load_weights() left (its objects are young). vLLM's second
full collection, after post-processing, stays as it is: load_model still
returns with every generation collected.

Only vLLM's base_loader module is affected (its `gc` name, for the length
of one load_model call on the calling thread's loader); a vLLM whose
base_loader does not import gc, or that no longer collects there, is left
alone.

frozen_heap() (option freeze_gc) goes further: every object that exists
when load_model starts is frozen for its length, so that both full
collections walk only what the load created, the garbage load_model is
collecting for (transient tensors, the construction's leftovers).
"""
from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager

logger = logging.getLogger("weightlift.vllm")


class _Collector:
    """Stands for the gc module in vLLM's base_loader during one load_model."""

    def __init__(self):
        self.moved = False  # the full collection ran before load_weights
        self.replaced = False  # vLLM's next one ran as a young collection
        self.seconds = 0.0

    def collect_now(self) -> None:
        """The full collection, before load_weights (the read-ahead reading)."""
        t = time.perf_counter()
        gc.collect()
        self.seconds = time.perf_counter() - t
        self.moved = True

    def collect(self, generation: int = 2) -> int:
        if self.moved and not self.replaced and generation == 2:
            self.replaced = True
            return gc.collect(1)
        return gc.collect(generation)

    def __getattr__(self, name):  # every other name of gc is gc's
        return getattr(gc, name)


@contextmanager
def moved_collection():
    """While active, vLLM's base_loader sees a _Collector as `gc`; yields it,
    or None where base_loader is not as expected."""
    try:
        from vllm.model_executor.model_loader import base_loader
    except ImportError:
        yield None
        return
    if getattr(base_loader, "gc", None) is not gc:
        yield None
        return
    collector = _Collector()
    base_loader.gc = collector
    try:
        yield collector
    finally:
        base_loader.gc = gc
        if collector.moved:
            logger.debug("weightlift: full gc.collect() ran before load_weights (%.2f s, the read-ahead reading); "
                         "vLLM's after load_weights ran as a young collection: %s", collector.seconds,
                         collector.replaced)


@contextmanager
def frozen_heap():
    """While active, the objects that existed on entry are in gc's permanent
    generation (gc.freeze()), unfrozen on exit whatever happens; nothing is
    done where the process had frozen objects itself (unfreezing would undo
    that too)."""
    if gc.get_freeze_count() > 0:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
