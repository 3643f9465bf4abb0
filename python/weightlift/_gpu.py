"""Weights straight into CUDA memory: vLLM's GPU loaders on weightlift's engine.

    from weightlift import fastsafetensors_weights_iterator   # vLLM's names and arguments
    from weightlift import instanttensor_weights_iterator

Both read through the C++ engine's stream strategy into device memory (a
small pinned staging ring with asynchronous copies, or GPUDirect Storage when
cuFile and the filesystem allow it; see docs/gpu.md) and yield torch CUDA
tensors that own their memory (DLPack), on torch's current CUDA device, in
file order and, within a file, in offset order. Without a usable GPU they
raise before reading anything, naming what is missing (a CUDA build of torch,
a device, the NVIDIA driver, the CUDA runtime).

Test seam: with the fake GPU backend (WEIGHTLIFT_GPU_BACKEND=fake) and
WEIGHTLIFT_TEST_TORCH_CUDA=N, this module answers as if torch had CUDA with
current device N, and device tensors come back as host copies (a torch
without CUDA cannot hold them), so every device entry point runs end to end
in CPU-only CI. Outside the fake backend the variable changes nothing.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Generator, Iterable
from typing import Any

import torch

from . import _core, _distributed, _tensors
from ._engine import iterate
from ._files import natural_sort
from ._log import log_once

# ---- devices ----------------------------------------------------------------------------

TEST_SEAM_ENV = "WEIGHTLIFT_TEST_TORCH_CUDA"


def test_seam_device() -> int | None:
    """The seam's current device (see the module's docstring): N when
    WEIGHTLIFT_TEST_TORCH_CUDA=N and the engine runs the fake GPU backend,
    else None. While it answers, device arrays become host copies."""
    value = os.environ.get(TEST_SEAM_ENV, "").strip()
    if not value or os.environ.get("WEIGHTLIFT_GPU_BACKEND") != "fake":
        return None
    if not _core.gpu_backend_name().startswith("fake"):
        return None
    _tensors.DEVICE_ARRAYS_TO_HOST = _core.gpu_copy_to_host
    return int(value)


def cuda_unavailable_reason() -> str:
    """Why no CUDA device can receive weights ("" when one can): torch's side
    (a CPU-only build, no device) and weightlift's own (driver, runtime)."""
    why = []
    if test_seam_device() is not None:
        pass  # torch "has" CUDA: the fake backend's devices
    elif getattr(torch.version, "cuda", None) is None:
        why.append(f"this torch ({torch.__version__}) is a CPU-only build, without CUDA")
    elif not torch.cuda.is_available():
        why.append("torch sees no CUDA device")
    engine = _core.gpu_unavailable_reason()
    if engine:
        why.append(f"weightlift: {engine}")
    return "; ".join(why)


def current_cuda_device(what: str = "loading to CUDA") -> str:
    """'cuda:N' for torch's current CUDA device; RuntimeError naming what is missing."""
    _require_cuda(what)
    seam = test_seam_device()
    device = f"cuda:{seam if seam is not None else torch.cuda.current_device()}"
    # The first load's one-time work (context, pinned ring, copier) starts
    # now, overlapping what comes before the load's first read.
    _core.gpu_warm_up(device)
    return device


def _require_cuda(what: str) -> None:
    why = cuda_unavailable_reason()
    if why:
        raise RuntimeError(f"{what} needs a CUDA device: {why}")


def _device_name(device: Any, what: str) -> str:
    """'cpu', 'pinned' or 'cuda:N' for a str / torch.device / int; CUDA checked."""
    if isinstance(device, int):
        device = f"cuda:{device}"
    d = str(device)
    if d in ("cpu", "pinned"):
        return d
    if d == "cuda":
        return current_cuda_device(what)
    if d.startswith("cuda:"):
        _require_cuda(what)
        _core.gpu_warm_up(d)
        return d
    raise ValueError(f"unknown device {device!r} (expected cpu, pinned, cuda or cuda:N)")


def _is_cuda(device: Any) -> bool:
    return isinstance(device, int) or str(device).startswith("cuda")


# ---- process groups (the distributed component decides what each rank reads) ----------------


def _world_group():
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def _group_size(pg) -> int:
    if pg is None:
        return 1
    return torch.distributed.get_world_size(pg)


def _collective_options(pg) -> dict:
    """Engine options for a process group: none for a single rank; otherwise
    the group goes to the engine, whose distributed loading decides what each
    rank reads (an engine without it raises ValueError naming the option)."""
    if _group_size(pg) <= 1:
        return {}
    return {"collective": _distributed.collective_for_group(pg)}


# ---- the device stream ------------------------------------------------------------------------


def _device_stream(files: list[str], device: str, gds: str, pg, desc: str, use_tqdm_on_load: bool,
                   per_tensor_bar: bool = False, exclude: list[str] | None = None,
                   local_expert_ids: set[int] | None = None) -> Generator[tuple[str, torch.Tensor], None, None]:
    """(name, tensor) of `files` on `device`, in checkpoint order, less
    `exclude` and other ranks' experts."""
    # Device memory is taken for the whole load up front (one allocation), so
    # queued tensors cost no host memory: no need to bound the queue by bytes.
    extra = {} if local_expert_ids is None else {"local_expert_ids": local_expert_ids}
    yield from iterate(files, desc=desc, use_tqdm_on_load=use_tqdm_on_load,
                       bar_per="tensor" if per_tensor_bar else "file", max_queued_bytes=1 << 62, ordered=True,
                       exclude=exclude, strategy="stream", device=device, gds=gds, **extra,
                       **_collective_options(pg))


def _gds_fallback(make: Callable[[bool], Iterable], nogds: bool) -> Generator[Any, None, None]:
    """The reference's rule: an error naming GDS falls back to loading without
    it, but only before the first item was yielded (restarting later would
    yield earlier tensors twice); any other error, or one after the first
    item, propagates. `make(nogds)` starts a load."""
    yielded = False
    try:
        for item in make(nogds):
            yielded = True
            yield item
    except (RuntimeError, OSError) as e:
        if nogds or yielded or "gds" not in str(e):
            raise
        log_once(logging.WARNING,
                 "GPUDirect Storage cannot be used (%s); loading through the pinned staging ring instead", e)
        yield from make(True)


def fastsafetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """vLLM's fastsafetensors iterator: every tensor of the safetensors files
    on torch's current CUDA device, with GPUDirect Storage when it is usable
    (not with several ranks, as the reference), falling back to the pinned
    ring only before the first tensor is yielded. Files in natural order; a
    torch.distributed process group, when initialised, goes to the engine."""
    pg = _world_group()
    device = current_cuda_device("fastsafetensors_weights_iterator")
    files = natural_sort(hf_weights_files)
    nogds = _group_size(pg) > 1

    def make(no_gds: bool):
        return _device_stream(files, device, "off" if no_gds else "auto", pg,
                              "Loading fastsafetensors checkpoint shards", use_tqdm_on_load)

    yield from _gds_fallback(make, nogds)


# Engram tables (vLLM 0.34): loaded on the host when asked, they can exceed
# device memory before tensor-parallel sharding.
_ENGRAM_WEIGHT_RE = re.compile(
    r"(?:^|\.)(?:engram\.embed\.(?:weight|scale)|ple\.ple_embedding\.ngram_embedding\.shard_[0-9]+\.weight)$")


def instanttensor_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    local_expert_ids: set[int] | None = None,
    *,
    load_engram_on_cpu: bool = False,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """vLLM's InstantTensor iterator: every tensor of the safetensors files on
    torch's current CUDA device, in file order (files sorted naturally), each
    tensor owning its memory. NVIDIA GPUs only (ValueError otherwise, naming
    what is missing); with more than one rank the world process group goes
    to the engine, unless the ranks load different tensors. local_expert_ids:
    other ranks' expert weights are skipped unread. load_engram_on_cpu: the
    Engram tables stay in host memory, yielded after the device tensors (a
    source of tables only needs no GPU: nothing goes to a device)."""
    files = natural_sort(hf_weights_files)
    names = [n for n, _, _ in _core.list_tensors(files)] if load_engram_on_cpu or local_expert_ids is not None else []
    on_host = [n for n in names if _ENGRAM_WEIGHT_RE.search(n)] if load_engram_on_cpu else []
    if not on_host or len(on_host) < len(names):
        yield from _instanttensor_device_part(files, use_tqdm_on_load, local_expert_ids, names, on_host)
    if on_host:
        yield from iterate(files, only=on_host, strategy="lazy", order="name", file_views=False)


def _instanttensor_device_part(files: list[str], use_tqdm_on_load: bool, local_expert_ids: set[int] | None,
                               names: list[str], on_host: list[str]) -> Generator[tuple[str, torch.Tensor], None, None]:
    """instanttensor_weights_iterator's tensors for the device: all but `on_host`."""
    why = cuda_unavailable_reason()
    if why:
        raise ValueError(f"InstantTensor loading requires an NVIDIA GPU: {why}")
    filtered = local_expert_ids is not None and any(_core.should_skip_weight(n, set()) for n in names)
    pg = _world_group()
    # Every rank must make the same choice: a per-rank tensor set leaves the collective out.
    if _group_size(pg) <= 1 or on_host or filtered:
        pg = None
    device = current_cuda_device("instanttensor_weights_iterator")
    yield from _device_stream(files, device, "auto", pg, "Loading safetensors using InstantTensor loader",
                              use_tqdm_on_load, per_tensor_bar=True, exclude=on_host or None,
                              local_expert_ids=local_expert_ids)


# ---- PyTorch files ----------------------------------------------------------------------------


def _single_cuda_target(map_location) -> str | None:
    """The one CUDA device a torch.load map_location sends every storage to, or None."""
    if isinstance(map_location, dict):
        targets = {str(v) for v in map_location.values()}
        if len(targets) != 1:
            return None
        map_location = targets.pop()
    if isinstance(map_location, (str, torch.device, int)) and _is_cuda(map_location):
        return str(map_location) if not isinstance(map_location, int) else f"cuda:{map_location}"
    return None


def pt_items_on_device(bin_file: str, pt_load_map_location) -> list[tuple[str, torch.Tensor]] | None:
    """(name, tensor) of a PyTorch .bin/.pt file read by our own reader into
    the CUDA device `pt_load_map_location` names ("cuda", "cuda:N", a
    torch.device, or a dict mapping every saved location to one CUDA device);
    None when it names no single CUDA device (then torch.load applies)."""
    target = _single_cuda_target(pt_load_map_location)
    if target is None:
        return None
    device = _device_name(target, "pt_load_map_location")
    return list(_device_stream([os.fspath(bin_file)], device, "off", None, "", False))
