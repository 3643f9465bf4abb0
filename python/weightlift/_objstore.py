"""Object storage (s3://, gs://) with the reference's Run:ai streamer iterator.

    from weightlift import runai_safetensors_weights_iterator
    for name, tensor in runai_safetensors_weights_iterator(
            ["s3://bucket/model/model-00001-of-00002.safetensors", ...], use_tqdm_on_load=True):
        ...

The C++ engine reads every file with the `stream` strategy: parallel ranged
GETs written straight into each tensor's own memory, under a memory cap.
Configuration (endpoint, region, credentials) comes from the environment as
for the AWS tools, see docs/s3.md; the Run:ai streamer's variables are read
too: RUNAI_STREAMER_CONCURRENCY (requests in flight), RUNAI_STREAMER_CHUNK_BYTESIZE
(bytes per request), RUNAI_STREAMER_MEMORY_LIMIT (-1 unlimited, 0 the minimum,
N bytes), RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING.
"""
from __future__ import annotations

import os
from collections.abc import Generator

import torch

from . import _distributed
from ._engine import iterate

# Default cap on the engine's own working memory (tensors being filled), and
# what RUNAI_STREAMER_MEMORY_LIMIT=0 ("the minimum") means.
_DEFAULT_MEMORY_LIMIT = 1 << 30
_MIN_MEMORY_LIMIT = 64 << 20
_QUEUED_BYTES = 256 << 20  # finished tensors waiting for the consumer


def _int_env(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def _engine_options() -> dict:
    opts: dict = {"ordered": True}
    concurrency = _int_env("RUNAI_STREAMER_CONCURRENCY")
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"RUNAI_STREAMER_CONCURRENCY={concurrency} is not a positive integer")
        opts["threads"] = concurrency
    chunk = _int_env("RUNAI_STREAMER_CHUNK_BYTESIZE")
    if chunk is not None:
        if chunk < 1:
            raise ValueError(f"RUNAI_STREAMER_CHUNK_BYTESIZE={chunk} is not a positive integer")
        opts["block_size"] = chunk
    limit = _int_env("RUNAI_STREAMER_MEMORY_LIMIT")
    if limit is None:
        opts["max_memory"] = _DEFAULT_MEMORY_LIMIT
    elif limit == 0:
        opts["max_memory"] = _MIN_MEMORY_LIMIT
    elif limit > 0:
        opts["max_memory"] = limit
    elif limit != -1:
        raise ValueError(f"RUNAI_STREAMER_MEMORY_LIMIT={limit}: use -1 (unlimited), 0 (minimum) or a byte count")
    return opts


def runai_safetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    is_distributed: bool = False,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Iterate over the weights in the model safetensor files (object URLs or
    local paths), in the reference's order: file by file as given, each file's
    tensors in offset order. Every tensor owns its memory (no clone needed:
    nothing is a view of a reused buffer); tensors are on the CPU.

    is_distributed: with torch.distributed initialised on more than one
    rank, the ranks read the files once in total and exchange over the
    default process group (tensors then come as they complete); otherwise
    every rank reads what it is given."""
    files = [os.fspath(f) for f in hf_weights_files]
    opts = _engine_options()
    group = _distributed.requested_group(True) if is_distributed else None
    if group is not None:
        del opts["ordered"]
        yield from _distributed.distributed_weights_iterator(files, use_tqdm_on_load, group=group, **opts)
        return
    yield from iterate(files, desc="Loading safetensors using weightlift's object-store streamer",
                       use_tqdm_on_load=use_tqdm_on_load, bar_per="tensor", bar_options={"mininterval": 2},
                       max_queued_bytes=_QUEUED_BYTES, strategy="stream", **opts)
