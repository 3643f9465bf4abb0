"""Distributed loading: the ranks of a torch.distributed process group read a
checkpoint once in total and exchange the rest over the group (the engine's
distributed mode; see docs/distributed.md).

    import torch.distributed as dist
    from weightlift._distributed import load_distributed

    dist.init_process_group("gloo")                   # or NCCL; any group
    for name, tensor in load_distributed(files):      # torch.distributed.group.WORLD
        ...

Every rank calls it with the same checkpoint (paths may differ, headers may
not) and the same shard rules. Each byte any rank needs is read from storage
by exactly one rank; tensors two or more ranks keep are all-gathered in large
chunks (never per tensor), a rank's tensor-parallel shards (shard_rules) and
experts only it holds (local_expert_ids) are read by that rank alone and never
move. One rank's failure (a bad or missing file, a different checkpoint, a
consumer that stops) raises on every rank with a message naming the rank; a
rank that dies makes the others raise when the group notices (gloo: at once
when the peer's connection closes, else at the group's timeout).

The buffers crossing torch.distributed are torch tensors over the engine's
memory (no copies): CPU tensors for gloo; CUDA tensors when the group's
backend is NCCL (the exchange buffers then live on the current device).
`nccl_collective()` takes an NCCL communicator the caller made instead.

Building blocks of the reference's distributed entry points:
    default_group()              torch.distributed.group.WORLD when initialised, else None
    wants_distributed(flag)      the safetensors iterators' opt-in: flag, else $WEIGHTLIFT_DISTRIBUTED=1
    requested_group(flag)        the group to load over when asked for and of more than one rank, else None
    distributed_weights_iterator(hf_weights_files, use_tqdm_on_load, group=None, **engine)
"""
from __future__ import annotations

import os
from collections.abc import Generator, Iterable

import torch

from . import _core
from ._engine import enable_tqdm, iterate, progress_bar
from ._files import weight_files

__all__ = [
    "TorchCollective",
    "default_group",
    "distributed_weights_iterator",
    "load_distributed",
    "nccl_collective",
    "requested_group",
    "wants_distributed",
]

ENV_FLAG = "WEIGHTLIFT_DISTRIBUTED"


def default_group():
    """torch.distributed.group.WORLD when torch.distributed is initialised (as
    the reference picks its process group), else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def wants_distributed(flag: bool | None = None) -> bool:
    """The opt-in of the safetensors iterators: `flag` when given, else the
    environment variable WEIGHTLIFT_DISTRIBUTED (1/true/yes)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


def requested_group(flag: bool | None = None):
    """The process group a distributed load runs over when the caller asks
    for one (wants_distributed(flag)) and more than one rank is there; None
    otherwise (every rank then reads what it is given)."""
    if not wants_distributed(flag):
        return None
    group = default_group()
    if group is None or torch.distributed.get_world_size(group) <= 1:
        return None
    return group


class TorchCollective:
    """The engine's Collective over a torch.distributed process group. The
    engine calls these methods from its loader thread (holding the GIL only
    for the call); the tensors it passes are views of its own memory, valid
    only during the call."""

    def __init__(self, group=None):
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group first")
        self._dist = dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()
        self.device = f"cuda:{torch.cuda.current_device()}" if self.backend == "nccl" else "cpu"
        if self.group is dist.group.WORLD:
            self._global = list(range(self.world_size))
        else:  # broadcast's src is a global rank
            get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
            self._global = [get(self.group, r) for r in range(self.world_size)]
        self.aborted = None

    def all_gather(self, buf: torch.Tensor, block: int) -> None:
        """In place: buf holds world_size blocks; this rank's is filled."""
        chunks = list(torch.split(buf, block))
        into = getattr(self._dist, "all_gather_into_tensor", None)
        if into is not None and self.backend == "nccl":
            into(buf, chunks[self.rank], group=self.group)
        else:  # gloo (torch 1.13) has no all_gather_into_tensor; it reads the input before writing the outputs
            self._dist.all_gather(chunks, chunks[self.rank], group=self.group)

    def broadcast(self, buf: torch.Tensor, root: int) -> None:
        self._dist.broadcast(buf, src=self._global[root], group=self.group)

    def all_gather_strings(self, mine: bytes) -> list[bytes]:
        dev = self.device
        n = torch.tensor([len(mine)], dtype=torch.int64, device=dev)
        lens_t = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.world_size)]
        self._dist.all_gather(lens_t, n, group=self.group)
        lens = [int(t.item()) for t in lens_t]
        longest = max(max(lens), 1)
        padded = torch.zeros(longest, dtype=torch.uint8)
        if mine:
            padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        padded = padded.to(dev)
        outs = [torch.empty(longest, dtype=torch.uint8, device=dev) for _ in range(self.world_size)]
        self._dist.all_gather(outs, padded, group=self.group)
        return [o[:k].cpu().numpy().tobytes() for o, k in zip(outs, lens)]

    def abort(self, why: str) -> None:
        # torch.distributed has no abort for a group here: the peers' pending
        # calls fail when this process exits, or at the group's timeout.
        self.aborted = why

    # Device groups (NCCL) only: the exchange memory and copies in and out of it.
    def allocate(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)
        if dst.is_cuda or src.is_cuda:
            torch.cuda.current_stream().synchronize()


class SoloCollective:
    """A world of one (no process group): the engine then reads everything itself."""

    rank, world_size, device = 0, 1, "cpu"

    def all_gather(self, buf, block):
        pass

    def broadcast(self, buf, root):
        pass

    def all_gather_strings(self, mine):
        return [bytes(mine)]

    def abort(self, why):
        pass


def nccl_collective(comm: int, stream: int = 0, device: int | None = None, timeout_s: float = 600.0):
    """A Collective over an NCCL communicator the caller made (its ncclComm_t
    as an integer: cupy's NcclCommunicator.ptr, or torch >= 2.2's
    ``pg._get_backend(torch.device("cuda"))._comm_ptr()`` after one warm-up
    collective), its work queued on `stream` (a cudaStream_t as an integer;
    0: a stream of its own). Pass it to load_distributed(collective=...)."""
    if device is None:
        device = torch.cuda.current_device()
    return _core.nccl_collective(int(comm), int(stream), int(device), float(timeout_s))


def collective_for_group(group=None):
    """The engine's Collective for a torch.distributed process group (None:
    a world of one). Pass it as the `collective` engine option."""
    return _core.python_collective(TorchCollective(group) if group is not None else SoloCollective())


def load_distributed(
    path_or_files: str | os.PathLike | Iterable[str],
    group=None,
    *,
    collective=None,
    shard_rules: Iterable[str] | None = None,
    local_expert_ids: Iterable[int] | None = None,
    max_queued_bytes: int = 1 << 30,
    raw_dtypes: bool | None = None,
    stats: dict | None = None,
    **engine,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) on every rank as the engine completes them (in
    no promised order), each tensor owning private host memory.

    group: the torch.distributed process group (default: group.WORLD; a
    world of one when torch.distributed is not initialised). collective: a
    Collective made elsewhere (nccl_collective()) instead of the group.
    shard_rules: ["*.q_proj.weight:0", ...]: this rank keeps only its shard
    (tp_rank = its rank, tp_size = the group's size). local_expert_ids: the
    experts this rank keeps (may differ by rank; others' are never read).
    engine: the loader's options (block_size: read size, each rank
    contributes 4x that per exchange round, default 32 MiB; threads;
    max_memory; direct "auto" | "on" | "off"). stats: filled at the end with
    the engine's figures (bytes_read: bytes this rank read from storage)."""
    files = weight_files(path_or_files)
    if collective is None:
        collective = collective_for_group(group if group is not None else default_group())
    opts = dict(engine)
    if shard_rules:
        opts["shard_rules"] = list(shard_rules)
    if local_expert_ids is not None:
        opts["local_expert_ids"] = sorted(int(i) for i in local_expert_ids)
    yield from iterate(files, max_queued_bytes=max_queued_bytes, ordered=False, raw_dtypes=raw_dtypes, stats=stats,
                       strategy="stream", collective=collective, **opts)


def distributed_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool = False,
    group=None,
    **engine,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """The reference iterators' shape over load_distributed(): what
    runai_safetensors_weights_iterator(..., is_distributed=True),
    fastsafetensors_weights_iterator and instanttensor_weights_iterator (with
    their process group) and the safetensors iterators (when
    wants_distributed()) yield from. group: as load_distributed()."""
    bar = progress_bar(None, desc="Loading safetensors checkpoint shards (distributed)", unit=" tensors",
                bar_format=None, disable=not enable_tqdm(use_tqdm_on_load))
    try:
        for name, tensor in load_distributed(hf_weights_files, group, **engine):
            bar.update(1)
            yield name, tensor
    finally:
        bar.close()
