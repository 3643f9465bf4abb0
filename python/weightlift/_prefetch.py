"""Page-cache prefetch for network filesystems: the facts the rule is decided
on, the decision as a load decides it (the engine's dry run), and the
engine's background Prefetcher (include/weightlift/prefetch.h, system.h).

weight_utils re-exports these under the reference's private names
(_get_fs_type, _prefetch_all_checkpoints, ...), which vLLM's tests patch
there; see weight_utils._prefetch_decision.

A leaf: imports only the bridge (_engine) and _log."""
from __future__ import annotations

import torch

from . import _engine
from ._log import logger

DEFAULT_NUM_THREADS = 8
DEFAULT_BLOCK_SIZE = 16 * 1024 * 1024


# ---- the facts (system.h) and the rule (prefetch.h) -------------------------------------


def checkpoints_size_bytes(files: list[str]) -> int:
    return _engine.checkpoint_size_bytes(files) if files else 0


def available_ram_bytes() -> int:
    """MemAvailable, bounded by the cgroup's remaining limit when there is one."""
    return _engine.available_ram_bytes()


def fs_type(files: list[str]) -> str:
    """The filesystem type serving files[0]; "" for an empty list or when it cannot be told."""
    return _engine.filesystem_type(files[0]) if files else ""


def decide(files: list[str], requested: bool, **known):
    """The prefetch rule as a load of the files decides it (the engine's dry
    run of plan_load, one call): prefetch
    when they sit on a network filesystem and fit in 90% of the available RAM,
    always when `requested` (a warning when they do not fit). `known`: facts
    the caller already holds (fstype, checkpoint_bytes, available_bytes); the
    engine measures the others. The answer's .prefetch, .warn, .reason (one
    line for the log) and the facts it used."""
    return _engine.decide_prefetch(files, requested, **known)


# ---- prefetching ----------------------------------------------------------------------------


def rank_world() -> tuple[int, int]:
    """(rank, world size) of torch.distributed when initialised, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def prefetch_checkpoint(file_path: str, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
    """Reads a file once, in blocks, so that its pages sit in the page cache."""
    _engine.prefetch_files([file_path], 1, block_size)


prefetchers = _engine.prefetchers  # running background prefetches (the reference's daemon threads); the last four kept
drain_logs = _engine.drain_logs


def prefetch_all(sorted_files: list[str], num_prefetch_threads: int = DEFAULT_NUM_THREADS,
                 block_size: int = DEFAULT_BLOCK_SIZE) -> None:
    """Starts reading this rank's share of the files (every world_size-th)
    into the page cache in the background (the engine's Prefetcher);
    failures are only logged."""
    rank, world = rank_world()
    _engine.start_prefetch(sorted_files, num_prefetch_threads, block_size, rank, world)
    logger.info("Prefetching checkpoint files into page cache started (in background, num_threads=%d, "
                "block_size=%d bytes)", num_prefetch_threads, block_size)
