"""The checkpoint read while vLLM builds the model.

vLLM's load_model() first constructs the model (modules built, every
parameter allocated: about a second on a 1 GB model, on one core) and only
then calls load_weights(). The files are known before construction starts
(the loader's file selection), so WeightliftModelLoader.load_model() starts
an engine read-ahead (weightlift._engine.read_ahead, read_ahead.h) first:

  * local files: into the page cache, this rank's 1/N of the bytes where N
    ranks share the host (the page cache is the host's: together they read
    the checkpoint once); load_weights() then places from memory;
  * s3:// and gs://: into staging memory that the load reads through the
    engine option `read_ahead` (bounded: the job waits for the load to
    consume staged blocks before it stages more); at TP 1 only (a rank's
    shards are known only once the model is built);
  * expert tensors of other ranks are never read (vLLM's EP filter, computed
    before construction as load_weights() computes it);
  * bounded by the plug-in's `max_memory` (0: half the available RAM in the
    page cache, a quarter staged).

And the first touch of the parameters' pages: construction allocates every
parameter and touches none, so the load's copies would fault in each page
(and the kernel zero it) as they write. WEIGHTLIFT's create_model() hands
each host parameter, as it is registered, to an engine Prefaulter
(FirstTouch below), whose thread faults the pages in beside the
construction; the copies then find them there.

The read-ahead and the first touch never fail a load: anything they cannot
do is logged and left to the load itself. Their figures (bytes read before
placement started: the overlap; bytes faulted in) go to the log and to the
loader's statistics.

And the end: parameters mapped onto the checkpoint's pages (map_params) are
read in before the load returns (make_resident), whatever the read-ahead
reached: inside load_model() on a thread of their own while vLLM
post-processes, load_model() waiting for it before it returns
(LateResidency); a load_weights() called alone, before it returns. A file
that cannot be (truncated under the mapping) fails the load there, not the
first inference.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time

import torch

from .._engine import is_object_url, populate_read, prefaulter, read_ahead

logger = logging.getLogger("weightlift.vllm")


class EarlyReads:
    """The read-ahead of one load_model() call (owned by the loader): an
    engine job and what it had done when placement started."""

    def __init__(self, job, files: list[str], remote: bool):
        self.job = job  # None once closed
        self.files = files
        self.remote = remote
        self.started = time.perf_counter()
        self.at_placement: dict | None = None

    def progress(self) -> dict:
        job = self.job
        return dict(job.progress()) if job is not None else dict(self.at_placement or {})

    def engine_options(self) -> dict:
        """Engine options for the load's calls: remote loads read the staging."""
        return {"read_ahead": self.job} if self.remote else {}

    def covers_everything(self) -> bool:
        """Every byte of the load is read ahead (or is being): nothing was
        left to the load by the memory bound. Waits for the job's plan (its
        headers read) when the model was built before it."""
        job = self.job
        p = dict(job.wait_planned()) if job is not None else self.progress()
        return bool(p.get("planned")) and p.get("bytes_capped", 1) == 0

    def placement_starts(self) -> dict:
        """The overlap: what the job had read when the first tensor is placed."""
        p = self.progress()
        p["since_start_seconds"] = time.perf_counter() - self.started
        self.at_placement = p
        mb = 1e6
        helped = p.get("bytes_helped", 0)
        logger.info("Read ahead while the model was built: %.0f of %.0f MB in %.2f s (%.0f MB were cached already%s%s)",
                    p["bytes_read"] / mb, (p["bytes_planned"] - p["bytes_cached"]) / mb,
                    p["since_start_seconds"], p["bytes_cached"] / mb,
                    f"; {helped / mb:.0f} MB of other ranks' shares" if helped else "",
                    "; done" if p["done"] else "; still reading")
        return p

    def close(self) -> None:
        """Stops the job, waits for it (the GIL released) and frees its staging."""
        job, self.job = self.job, None
        if job is None:
            return
        job.stop()
        why = job.wait()
        if why:
            logger.info("read-ahead: %s (the load read those bytes itself)", why)


class FirstTouch:
    """While active (a `with` block around the model's construction), every
    host parameter registered is queued to a Prefaulter; stop() ends it
    (before placement starts)."""

    MIN_BYTES = 1 << 20  # smaller parameters are not worth a queue entry

    def __init__(self):
        self.job = prefaulter()
        self._hook = None

    def _registered(self, module, name, param):
        if param is None or self.job is None:
            return None
        try:
            if param.device.type == "cpu" and param.layout == torch.strided and not param.is_meta:
                n = param.numel() * param.element_size()
                if n >= self.MIN_BYTES and param.data_ptr():
                    self.job.add(param.data_ptr(), n)
        except Exception:  # a tensor subclass without storage: not ours to touch
            pass
        return None

    def __enter__(self):
        register = getattr(torch.nn.modules.module, "register_module_parameter_registration_hook", None)
        if register is not None:  # torch >= 2.0
            self._hook = register(self._registered)
        return self

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        return False

    def stop(self) -> dict:
        """Stops the thread (the GIL released); {bytes_queued, bytes_done}."""
        job, self.job = self.job, None
        if job is None:
            return {}
        job.stop()
        return {"bytes_queued": job.bytes_queued(), "bytes_done": job.bytes_done()}


def make_resident(mapped: list[tuple[str, str, int, int]], threads: int = 0) -> dict:
    """The end of the read-ahead for parameters mapped onto the checkpoint's
    pages (map_params), [(parameter, file, address, nbytes)]: every page
    read in where the page cache does not hold it (a cold load placed while
    the read-ahead still read, or the kernel let pages go) and mapped, so
    that a load that returns leaves no read to the first inference, as a
    copying loader does. The engine's populate_read; its figures
    {bytes, bytes_not_resident, seconds}, logged when something was read.
    A file truncated under its mapping is a RuntimeError naming the
    parameter and the file (a later access would raise SIGBUS)."""
    try:
        got = populate_read([(a, n) for _, _, a, n in mapped], threads=threads)
    except OSError as e:
        m = re.search(r"range (\d+)", str(e))
        i = int(m.group(1)) if m else -1
        where = f"parameter {mapped[i][0]}, mapped onto {mapped[i][1]}, " if 0 <= i < len(mapped) else ""
        raise RuntimeError(f"weightlift: {where}cannot be read into memory ({e}); was the checkpoint modified "
                           f"while it loaded? (map_params: false copies every parameter)") from e
    if got["bytes_not_resident"]:
        logger.info("weightlift: %.0f MB of the mapped parameters were not in memory yet: read in %.2f s",
                    got["bytes_not_resident"] / 1e6, got["seconds"])
    return got


class LateResidency:
    """make_resident() on a thread of its own, for a load_weights() that runs
    inside load_model(): the mapped parameters' pages still on the disk are
    read while vLLM post-processes and collects garbage, and load_model()
    waits for them (wait()) before it returns. A page an access needs
    earlier is read by that access (the kernel's page fault), so the bytes
    are the same either way; what moves is when the disk's last reads
    happen.

    `keep`: the mapped tensors themselves, held until their pages are in:
    post-processing may replace a parameter (vLLM's CPU backend repacks a
    linear layer's weight and drops it), and the mapping must not go away
    under the thread reading it in."""

    def __init__(self, mapped: list[tuple[str, str, int, int]], keep: list, threads: int, cpus: str):
        self._result: dict | None = None
        self._error: BaseException | None = None
        self._keep = keep
        self._thread = threading.Thread(target=self._run, args=(mapped, threads, cpus), daemon=True,
                                        name="weightlift-residency")
        self._thread.start()

    def _run(self, mapped, threads, cpus) -> None:
        from . import _affinity

        try:
            with _affinity.widened(cpus):  # this thread's (and its engine threads')
                self._result = make_resident(mapped, threads=threads)
        except BaseException as e:  # handed to wait()'s caller
            self._error = e
        finally:
            self._keep = None  # the mappings may go now

    def wait(self) -> dict:
        """Joins the thread (the GIL released); its figures, plus
        waited_seconds (how long the caller waited); its error re-raised."""
        t = time.perf_counter()
        self._thread.join()
        if self._error is not None:
            raise self._error
        got = dict(self._result or {})
        got["waited_seconds"] = time.perf_counter() - t
        got["late"] = True
        return got


def _host_ranks() -> tuple[int, int]:
    """(this rank, ranks) among the ranks of this host that load the same
    checkpoint: vLLM's world group divided by its node count; (0, 1) alone."""
    try:
        from vllm.distributed import parallel_state as ps

        world = ps.get_world_group()
        nodes = max(int(getattr(ps, "get_node_count", lambda: 1)()), 1)
        per_node = max(world.world_size // nodes, 1)
        return world.local_rank % per_node, per_node
    except Exception:  # no parallel state (a loader used on its own)
        return 0, 1


def start(loader, model_config, tp_size: int = 1) -> EarlyReads | None:
    """Starts the read-ahead of `loader` (a WeightliftModelLoader) for
    `model_config`'s weights (tp_size: the tensor-parallel group's), or returns None (with the reason in the debug
    log) where it does not apply: the option off, a Hub repository (loaded
    while it downloads already), npcache, .pt files mapped to a device."""
    opts = loader.options
    if not opts.read_ahead or opts.format == "npcache":
        return None
    location = loader._weights_location(model_config)
    remote = is_object_url(location)
    if not remote and not os.path.isdir(location):
        logger.debug("read-ahead: %s is not a local folder or an object-storage URL", location)
        return None
    if remote and tp_size > 1:
        # Staging is this process's memory, for its own load; at TP > 1 that
        # load reads this rank's shards, which are known only once the model
        # is built (its parameters' split dimensions).
        logger.info("read-ahead: not for object storage at tensor-parallel size > 1")
        return None
    try:
        _, files, use_safetensors, _ = loader._prepare_weights(location, None, model_config.revision, True, None)
        location_map = loader.load_config.pt_load_map_location
        if not use_safetensors and location_map not in (None, "cpu") and location_map != {"": "cpu"}:
            return None
        try:
            loader._init_ep_weight_filter(model_config)
        except Exception as e:  # the EP filter needs vLLM's config context: without it, every expert
            logger.debug("read-ahead: no expert filter (%s)", e)
        experts = loader.local_expert_ids
        rank, world = (0, 1) if remote else _host_ranks()
        from . import _affinity

        first = None if remote else _copied_first(model_config, files, tp_size)
        # The job's threads run beside the construction, not on its core.
        with _affinity.widened(opts.cpus, beside=True):
            job = read_ahead(files, threads=opts.threads, block_size=opts.block_size, max_memory=opts.max_memory,
                             rank=rank, world_size=world,
                             local_expert_ids=None if experts is None else sorted(experts), first=first)
    except Exception as e:  # the load reads everything itself, as before
        logger.info("read-ahead not started: %s", e)
        return None
    logger.debug("read-ahead started: %d files, rank %d of %d, remote %s%s", len(files), rank, world, remote,
                 f", {len(first)} tensors to copy first" if first else "")
    return EarlyReads(job, [os.fspath(f) for f in files], remote)


def _copied_first(model_config, files: list[str], tp_size: int = 1) -> list[str] | None:
    """The tensors the load will copy, which the read-ahead reads before
    the ones it will map (the engine's `first`), or None for one pass in
    file order.

    The copies run in load_weights; the mapped parameters (map_params: whole
    parameters, or dim-0 shards, made views of the page cache) are needed
    only by the end of load_model (LateResidency). Read in that order, the
    copies find their bytes in memory when placement starts, and the disk
    reads the rest while the copies and vLLM's post-processing run. Which is
    which is known before construction only roughly, so this guesses (a
    wrong guess costs order, never bytes):

      * TP 1: copied are what vLLM stacks (q/k/v into qkv_proj, gate/up into
        gate_up_proj: the model class's packed_modules_mapping, from vLLM's
        registry); every other whole parameter is mapped;
      * TP > 1: row-parallel layers (split on dim 1) are copied too, and
        the mapped ones are the vocabulary-parallel embeddings and LM head
        (2-D, first dimension the config's vocabulary size)."""
    try:
        from .._engine import list_tensors

        if tp_size > 1:
            vocab = int(model_config.get_vocab_size())

            def mapped(name, shape):
                return len(shape) == 2 and int(shape[0]) == vocab
        else:
            packed = getattr(_model_class(model_config), "packed_modules_mapping", None) or {}
            parts = {p for subs in packed.values() for p in (subs if isinstance(subs, (list, tuple)) else ())}
            if not parts:
                return None

            def mapped(name, shape):
                return not parts.intersection(name.split("."))
        listed = list_tensors(files)
        first = [n for n, _, s in listed if not mapped(n, s)]
    except Exception as e:  # no model class or config to ask (a loader used on its own), an unreadable header
        logger.debug("read-ahead: one pass in file order (%s)", e)
        return None
    return first if first and len(first) < len(listed) else None


def _model_class(model_config):
    """The class vLLM will build for `model_config` (its registry; the
    construction imports the same module)."""
    from vllm.model_executor.model_loader.utils import get_model_architecture

    return get_model_architecture(model_config)[0]
