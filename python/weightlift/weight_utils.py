"""vLLM's weight utilities (vllm/model_executor/model_loader/weight_utils.py),
same names, arguments and results, on weightlift's engine.

Replace `from vllm.model_executor.model_loader.weight_utils import X` with
`from weightlift.vllm_compat import X`. Iterators yield (name, torch.Tensor);
safetensors tensors are zero-copy views of a copy-on-write mapping (lazy) or of
one whole-file buffer (eager), so they are writable and never alias the file.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import filelock
import numpy as np
import torch

from . import _core
from ._tensors import to_torch
from .ep_weight_filter import should_skip_weight

logger = logging.getLogger("weightlift")

DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS = 8
DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE = 16 * 1024 * 1024
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# Plain text, one line per update: readable under Ray / multiprocessing log prefixes.
_BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"

_NET_FILESYSTEMS = ("nfs", "nfs4", "lustre")
_warned: set[str] = set()


def _log_once(level: int, msg: str, *args) -> None:
    key = msg % args if args else msg
    if key not in _warned:
        _warned.add(key)
        logger.log(level, msg, *args)


def _tqdm(iterable, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(iterable, bar_format=_BAR_FORMAT, **kwargs)


# ---- locks and atomic files ------------------------------------------------------

temp_dir = tempfile.gettempdir()


def get_lock(model_name_or_path: str | Path, cache_dir: str | None = None) -> filelock.FileLock:
    """A file lock shared by every process (and user) working on this model.

    The lock file is <cache_dir or the temp dir>/<sha256(name)><name>.lock with
    '/' in the name replaced by '-', mode 0o666 so other users can take it."""
    lock_dir = cache_dir or temp_dir
    model_name_or_path = str(model_name_or_path)
    # The reference creates the parent of lock_dir (a quirk kept for identical behaviour).
    os.makedirs(os.path.dirname(lock_dir), exist_ok=True)
    model_name = model_name_or_path.replace("/", "-")
    hash_name = hashlib.sha256(model_name.encode()).hexdigest()
    lock_file_name = hash_name + model_name + ".lock"
    return filelock.FileLock(os.path.join(lock_dir, lock_file_name), mode=0o666)


@contextmanager
def atomic_writer(filepath: str | Path, mode: str = "w", encoding: str | None = None) -> Generator[IO, None, None]:
    """Yields a temporary file beside `filepath`; on success it replaces
    `filepath` in one rename, on an exception the original is untouched and the
    temporary is removed (the exception propagates)."""
    tmp_fd, tmp_path = tempfile.mkstemp(dir=os.path.dirname(filepath))
    try:
        with os.fdopen(tmp_fd, mode=mode, encoding=encoding) as f:
            yield f
        os.replace(tmp_path, filepath)
    except Exception:
        logger.exception("Error during atomic write. Original file '%s' not modified", filepath)
        raise
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)


# ---- file selection ------------------------------------------------------------------


def _natural_sort_key(filepath: str) -> list:
    """Sort key splitting the base name into text and numbers:
    model-00001-of-00005.safetensors -> ['model-', 1, '-of-', 5, '.safetensors']."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", os.path.basename(filepath))]


def filter_duplicate_safetensors_files(hf_weights_files: list[str], hf_folder: str, index_file: str) -> list[str]:
    """Keeps only the files the folder's index names (drops e.g. a consolidated
    file next to shards). FileNotFoundError when the index names a missing file."""
    if not os.path.isfile(os.path.join(hf_folder, index_file)):
        return hf_weights_files
    return _core.filter_duplicate_safetensors_files(list(hf_weights_files), str(hf_folder), index_file)


def filter_files_not_needed_for_inference(hf_weights_files: list[str]) -> list[str]:
    """Drops training_args.bin, optimizer.bin/.pt, scheduler.pt and scaler.pt."""
    return _core.filter_files_not_needed_for_inference(list(hf_weights_files))


# ---- progress ----------------------------------------------------------------------------


def enable_tqdm(use_tqdm_on_load: bool) -> bool:
    """Show a bar only when asked and only on rank 0 of torch.distributed."""
    return bool(use_tqdm_on_load) and (
        not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or torch.distributed.get_rank() == 0
    )


# ---- prefetch (network filesystems) ----------------------------------------------------


def _get_checkpoints_size_bytes(files: list[str]) -> int:
    return sum(os.path.getsize(f) for f in files) if files else 0


def _get_available_ram_bytes() -> int:
    """MemAvailable, bounded by the cgroup's remaining limit when there is one."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            avail = min(avail, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return avail


def _get_fs_type(files: list[str]) -> str:
    """The filesystem type serving files[0] (longest mount-point prefix in
    /proc/mounts); "" for an empty list or when it cannot be told."""
    if not files:
        return ""
    try:
        resolved = os.path.realpath(files[0])
        best_mount, best_type = "", ""
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount, fstype = parts[1], parts[2]
                inside = resolved == mount or resolved.startswith(os.path.join(mount, ""))
                if inside and len(mount) > len(best_mount):
                    best_mount, best_type = mount, fstype
        return best_type
    except Exception:
        return ""


def _prefetch_checkpoint(file_path: str, block_size: int = DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE) -> None:
    """Reads a file once, in blocks, so that its pages sit in the page cache."""
    if block_size < 1:
        raise ValueError("safetensors prefetch block size must be >= 1")
    with open(file_path, "rb", buffering=0) as f:
        buf = bytearray(block_size)
        while f.readinto(buf):
            pass


def _prefetch_all_checkpoints(sorted_files: list[str],
                              num_prefetch_threads: int = DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS,
                              block_size: int = DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE) -> None:
    """Starts reading this rank's share of the files (every world_size-th) into
    the page cache on a background thread; failures are only logged."""
    if num_prefetch_threads < 1:
        raise ValueError("safetensors prefetch num threads must be >= 1")
    if block_size < 1:
        raise ValueError("safetensors prefetch block size must be >= 1")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = 0, 1
    mine = sorted_files[rank::world]

    def run() -> None:
        start = time.perf_counter()
        done = 0
        next_pct = 10
        with concurrent.futures.ThreadPoolExecutor(max_workers=num_prefetch_threads) as ex:
            futures = {ex.submit(_prefetch_checkpoint, p, block_size): p for p in mine}
            for fut in concurrent.futures.as_completed(futures):
                try:
                    fut.result()
                except Exception:
                    logger.warning("Failed to prefetch checkpoint file %r.", futures[fut], exc_info=True)
                    continue
                done += 1
                while mine and next_pct <= 100 and 100 * done / len(mine) >= next_pct:
                    logger.info("Prefetching checkpoint files: %d%% (%d/%d)", next_pct, done, len(mine))
                    next_pct += 10
        logger.info("Prefetching checkpoint files into page cache finished in %.2fs", time.perf_counter() - start)

    logger.info("Prefetching checkpoint files into page cache started (in background, num_threads=%d, "
                "block_size=%d bytes)", num_prefetch_threads, block_size)
    threading.Thread(target=run, daemon=True, name="weightlift-prefetch").start()


# ---- iterators ------------------------------------------------------------------------------

_STRATEGIES = (None, "lazy", "eager", "prefetch", "torchao")


def safetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    safetensors_load_strategy: str | None = None,
    local_expert_ids: set[int] | None = None,
    *,
    safetensors_prefetch_num_threads: int = DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS,
    safetensors_prefetch_block_size: int = DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) for every tensor of the files, files in natural
    order, names sorted within a file (lazy/prefetch) or in file order (eager).

    Strategies: None (mmap; prefetch first when the files are on NFS/Lustre and
    fit in 90% of free RAM), "lazy" (mmap), "eager" (each file read whole with
    one read), "prefetch" (page-cache prefetch on a background thread, then
    mmap), "torchao" (rebuilds torchao tensor subclasses; needs torchao>=0.15).
    With local_expert_ids, other ranks' expert weights are skipped unread."""
    if safetensors_load_strategy not in _STRATEGIES:
        raise ValueError(f"unknown safetensors_load_strategy {safetensors_load_strategy!r} "
                         f"(expected one of None, 'lazy', 'eager', 'prefetch', 'torchao')")
    desc = "Loading safetensors checkpoint shards"
    if safetensors_load_strategy == "eager":
        desc += " (eager)"
    sorted_files = sorted(hf_weights_files, key=_natural_sort_key)

    fs_type = _get_fs_type(sorted_files)
    is_net_fs = fs_type in _NET_FILESYSTEMS
    total = _get_checkpoints_size_bytes(sorted_files)
    avail = _get_available_ram_bytes()
    fits = total <= 0.9 * avail
    fs_name = fs_type.upper() if fs_type else "unknown"
    _log_once(logging.INFO, "Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. Available RAM: %.2f GiB.",
              fs_name, total / 2**30, avail / 2**30)
    prefetch = safetensors_load_strategy == "prefetch"
    if safetensors_load_strategy is None and is_net_fs:
        if fits:
            prefetch = True
        else:
            _log_once(logging.WARNING, "Network filesystem (%s) detected but the checkpoint (%.2f GiB) exceeds 90%% "
                      "of available RAM (%.2f GiB); not prefetching.", fs_name, total / 2**30, avail / 2**30)
    elif prefetch and not fits:
        _log_once(logging.WARNING, "safetensors_load_strategy='prefetch' with a checkpoint (%.2f GiB) larger than "
                  "90%% of available RAM (%.2f GiB): this may run out of memory.", total / 2**30, avail / 2**30)
    if prefetch:
        _prefetch_all_checkpoints(sorted_files, num_prefetch_threads=safetensors_prefetch_num_threads,
                                  block_size=safetensors_prefetch_block_size)

    files = _tqdm(sorted_files, desc=desc, disable=not enable_tqdm(use_tqdm_on_load))
    if safetensors_load_strategy == "torchao":
        yield from _torchao_iterator(files, local_expert_ids)
        return
    eager = safetensors_load_strategy == "eager"
    for st_file in files:
        f = _core.SafetensorsFile(os.fspath(st_file), "eager" if eager else "lazy")
        names = [t[0] for t in f.tensors()] if eager else f.names()
        for name in names:
            if should_skip_weight(name, local_expert_ids):
                continue
            dtype, shape, data = f.get(name)
            yield name, to_torch(dtype, shape, data, name, f.path)
        del f


def _torchao_iterator(files, local_expert_ids):
    try:
        import torchao  # noqa: F401
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict
    except ImportError as e:
        raise ValueError("Please use torchao version >= 0.15.0 to load torchao safetensors checkpoint") from e
    leftover: dict[str, torch.Tensor] = {}
    for st_file in files:
        f = _core.SafetensorsFile(os.fspath(st_file), "lazy")
        state = {}
        for name in f.names():
            if not should_skip_weight(name, local_expert_ids):
                dtype, shape, data = f.get(name)
                state[name] = to_torch(dtype, shape, data, name, f.path)
        state.update(leftover)
        unflat, leftover = unflatten_tensor_state_dict(state, f.metadata() or None)
        yield from unflat.items()


def _read_file_tensors(st_file: str) -> list[tuple[str, torch.Tensor]]:
    # One read of the whole file (GIL released inside); tensors are views into it.
    f = _core.SafetensorsFile(os.fspath(st_file), "eager")
    out = []
    for name in f.names():
        dtype, shape, data = f.get(name)
        out.append((name, to_torch(dtype, shape, data, name, f.path)))
    return out


def multi_thread_safetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    max_workers: int = 4,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Reads whole files on `max_workers` threads and yields each file's
    tensors as soon as it is read (files in completion order). At most
    max_workers + 1 files are in flight or waiting, which bounds memory."""
    yield from _threaded(hf_weights_files, _read_file_tensors, max_workers,
                         "Multi-thread loading shards", use_tqdm_on_load)


def _threaded(files, read_one, max_workers, desc, use_tqdm_on_load):
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    files = list(files)
    bar = _tqdm(None, total=len(files), desc=desc, disable=not enable_tqdm(use_tqdm_on_load))
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as ex:
            pending: set[concurrent.futures.Future] = set()
            it = iter(files)
            for f in it:
                pending.add(ex.submit(read_one, f))
                if len(pending) >= max_workers + 1:
                    break
            while pending:
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    items = list(fut.result())
                    del fut
                    bar.update(1)
                    nxt = next(it, None)
                    if nxt is not None:
                        pending.add(ex.submit(read_one, nxt))
                    items.reverse()  # pop from the end, yielding in file order, dropping each as it goes
                    while items:
                        yield items.pop()
    finally:
        bar.close()


def _pt_items(bin_file: str, pt_load_map_location) -> Iterable[tuple[str, Any]]:
    """(name, value) of a PyTorch checkpoint, through the C++ reader when this
    build has it (and the map location is "cpu"), else torch.load."""
    if pt_load_map_location in ("cpu", None) or str(pt_load_map_location) == "cpu":
        try:
            ck = _core.Checkpoint(os.fspath(bin_file))
        except NotImplementedError:
            ck = None
        if ck is not None:
            out = []
            for i, (name, dtype, shape, _) in enumerate(ck.tensors()):
                d, s, data = ck.get(i)
                out.append((name, to_torch(d, s, data, name, ck.path)))
            return out
    state = torch.load(bin_file, map_location=pt_load_map_location, weights_only=True)
    return list(state.items())


def pt_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    pt_load_map_location: str | dict[str, str] = "cpu",
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) of PyTorch .bin/.pt files, one file at a time."""
    for bin_file in _tqdm(hf_weights_files, desc="Loading pt checkpoint shards",
                          disable=not enable_tqdm(use_tqdm_on_load)):
        items = _pt_items(bin_file, pt_load_map_location)
        yield from items
        del items


def multi_thread_pt_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    pt_load_map_location: str | dict[str, str] = "cpu",
    max_workers: int = 4,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """PyTorch files read on `max_workers` threads, yielded in completion order."""
    yield from _threaded(hf_weights_files, lambda f: list(_pt_items(f, pt_load_map_location)), max_workers,
                         "Multi-thread loading pt checkpoint shards", use_tqdm_on_load)


def np_cache_weights_iterator(
    model_name_or_path: str,
    cache_dir: str | None,
    hf_folder: str,
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Converts the weight files to one .npy per tensor under <hf_folder>/np
    (once, by the first process, under the model's lock: get_lock's file),
    then yields them from there in dump order; each tensor is a
    copy-on-write mapping of its .npy file."""
    bar = _tqdm(None, total=len(hf_weights_files), desc="Loading np_cache checkpoint shards",
                disable=not enable_tqdm(use_tqdm_on_load))
    try:
        lock = _core.model_lock_path(str(model_name_or_path), cache_dir or temp_dir)
        np_folder, names, _ = _core.np_cache_prepare([os.fspath(f) for f in hf_weights_files],
                                                     os.fspath(hf_folder), lock)
        bar.update(len(hf_weights_files))
    finally:
        bar.close()
    for name in names:
        arr = np.load(os.path.join(np_folder, name), mmap_mode="c")
        yield name, torch.from_numpy(arr)


def stream_weights(
    path_or_files: str | os.PathLike | list[str],
    strategy: str = "lazy",
    *,
    use_tqdm_on_load: bool = False,
    local_expert_ids: set[int] | None = None,
    max_queued_bytes: int = 1 << 30,
    **engine,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """weightlift's own streaming iterator: the C++ loader reads the files on a
    background thread (GIL released) while you consume, holding at most
    `max_queued_bytes` of finished tensors ahead of you. Yields (name, tensor)
    in the engine's order (file order for lazy/eager); each tensor owns
    private memory. `path_or_files` is a model folder, a file, or a list of files.

    strategy and `engine` options are the C++ loader's (see docs/engine.md):
    strategy lazy | eager | prefetch | auto | threads | stream; threads,
    block_size, rank, world_size (prefetch striping), tp_rank, tp_size,
    shard_rules (["*.q_proj.weight:0", ...]: read only this rank's slice),
    max_memory, direct ("auto" | "on" | "off"). With local_expert_ids, other
    ranks' expert weights are skipped (unread where the engine filters)."""
    if isinstance(path_or_files, (str, os.PathLike)):
        files, _fmt = _core.find_weight_files(os.fspath(path_or_files))
    else:
        files = [os.fspath(f) for f in path_or_files]
    opts = dict(engine)
    if local_expert_ids is not None:
        opts["local_expert_ids"] = sorted(local_expert_ids)
    try:
        stream = _core.Stream(files, strategy, max_queued_bytes, opts)
    except ValueError as e:
        if "local_expert_ids" not in str(e):
            raise
        opts.pop("local_expert_ids")  # an engine without the filter: filter here instead
        stream = _core.Stream(files, strategy, max_queued_bytes, opts)
    bar = _tqdm(None, total=len(files), desc="Loading safetensors checkpoint shards",
                disable=not enable_tqdm(use_tqdm_on_load))
    seen_files: set[str] = set()
    try:
        for name, file, dtype, shape, data in stream:
            if file not in seen_files:
                seen_files.add(file)
                bar.n = len(seen_files) - 1
                bar.refresh()
            if should_skip_weight(name, local_expert_ids):
                continue
            yield name, to_torch(dtype, shape, data, name, file)
        bar.n = len(files)
        bar.refresh()
    finally:
        stream.close()
        bar.close()


# ---- conversion ------------------------------------------------------------------------------


def _shared_pointers(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    by_ptr = defaultdict(list)
    for k, v in tensors.items():
        by_ptr[v.data_ptr()].append(k)
    return [names for names in by_ptr.values() if len(names) > 1]


def convert_bin_to_safetensor_file(pt_filename: str, sf_filename: str) -> None:
    """Rewrites a PyTorch checkpoint as safetensors (metadata {"format": "pt"})
    in C++, without unpickling anything executable: unwraps "state_dict",
    keeps the first name of tensors sharing memory, writes every tensor
    contiguous, and checks the new file (size within 1% of the input, every
    tensor equal) before it takes its final name. RuntimeError when a check
    fails or the input cannot be converted; FileNotFoundError for a missing input."""
    try:
        _core.convert_pytorch_to_safetensors(os.fspath(pt_filename), os.fspath(sf_filename))
    except (FileNotFoundError, PermissionError):
        raise
    except (ValueError, OSError, NotImplementedError) as e:
        raise RuntimeError(str(e)) from e


# ---- weight loaders ---------------------------------------------------------------------------

LoaderFunction = Callable[[torch.Tensor, torch.Tensor], None]


def get_tensor_model_parallel_rank() -> int:
    """vLLM's TP rank when vLLM's parallel state is set up, else the
    torch.distributed rank, else 0."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank as vllm_rank

        return vllm_rank()
    except Exception:
        pass
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def convert_pyslice_to_tensor(x: Any) -> torch.Tensor:
    """A slice object (safetensors' get_slice) read whole; tensors pass through."""
    if not isinstance(x, torch.Tensor):
        x = x[:]
    return x


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copies `loaded_weight` into `param` in place; one-element tensors of any
    shape match each other, otherwise the sizes must be equal (AssertionError)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.copy_(loaded_weight.view(param.shape))
        return
    assert param.size() == loaded_weight.size(), (
        f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
    param.data.copy_(loaded_weight)


def row_parallel_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Loads this TP rank's rows (dim 0) of a row-parallel weight; 1-D params are whole."""
    if param.dim() != 1:
        size = param.data.shape[0]
        loaded_weight = loaded_weight.narrow(0, get_tensor_model_parallel_rank() * size, size)
    return default_weight_loader(param, loaded_weight)


def sharded_weight_loader(shard_axis: int) -> LoaderFunction:
    """A loader taking this TP rank's shard along `shard_axis`."""

    def loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        size = param.data.shape[shard_axis]
        loaded_weight = loaded_weight.narrow(shard_axis, get_tensor_model_parallel_rank() * size, size)
        return default_weight_loader(param, loaded_weight)

    return loader


def composed_weight_loader(loader: LoaderFunction, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoaderFunction:
    """A loader that runs `loader`, then replaces the param with fn(param)."""

    def composed(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        loader(param, loaded_weight)
        param.data.copy_(fn(param))

    return composed


# ---- dummy weights ------------------------------------------------------------------------------


def initialize_dummy_weights(model: torch.nn.Module, model_config: Any = None, low: float = -1e-3,
                             high: float = 1e-3, seed: int = 1234) -> None:
    """Fills every floating-point tensor of the model's state_dict with
    uniform [low, high) values from a generator seeded afresh per tensor, so
    a value depends only on the seed, the tensor's size and dtype (identical
    across TP ranks and runs)."""
    for param in model.state_dict().values():
        initialize_single_dummy_weight(param, low, high, seed)


@torch.no_grad()
def initialize_single_dummy_weight(param: torch.Tensor, low: float = -1e-3, high: float = 1e-3,
                                   seed: int = 1234) -> None:
    if param.device.type == "meta":
        return
    if not torch.is_floating_point(param):
        if getattr(torch.version, "hip", None):
            param.zero_()  # ROCm leaves integer params uninitialised
        return
    generator = torch.Generator(device=param.data.device)
    generator.manual_seed(seed)
    if torch.finfo(param.data.dtype).bits < 16:
        # uniform_ has no kernels below 16 bits (float8): draw in fp16, then cast.
        tmp = param.data.to(torch.float16).uniform_(low, high, generator=generator)
        param.data.copy_(tmp.to(param.data.dtype))
    else:
        param.uniform_(low, high, generator=generator)


# ---- name remapping ---------------------------------------------------------------------------------

_KV_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".q_scale", ".k_zero_point", ".v_zero_point", ".q_zero_point",
                      ".q.scale", ".k_cache.scale", ".v_cache.scale")


def _scale_patterns(attn: str) -> list[tuple[re.Pattern, str]]:
    rules = [
        (r"\.self_attn\.([kv])_proj\.([kv])_scale$", rf".self_attn.{attn}.\2_scale"),  # ModelOpt
        (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),  # fused QKV
        (r"\.self_attn\.qkqkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),  # Qwen3 MoE
        (r"\.mixer\.[kv]_proj\.([kv])_scale$", r".mixer.attn.\1_scale"),  # NemotronH
        (r"\.self_attn\.q\.scale$", r".self_attn.attn.q_scale"),  # HYV3
        (r"\.self_attn\.([kv])_cache\.scale$", r".self_attn.attn.\1_scale"),  # HYV3
        (r"\.([qkv])_scale$", r".attn.\1_scale"),  # default
        (r"\.([qkv])_zero_point$", r".attn.\1_zero_point"),
    ]
    return [(re.compile(p), r) for p, r in rules]


_PATTERNS = {"attn": _scale_patterns("attn"), "mla_attn.mla_attn": _scale_patterns("mla_attn.mla_attn")}


def maybe_remap_kv_scale_name(name: str, params_dict: dict) -> str | None:
    """The model's name for a checkpoint's FP8 k/v/q scale (or zero point), the
    name itself when no remapping applies, or None when the remapped name is
    not a parameter of the model (the scale is then not loaded)."""
    if name in params_dict:
        return name
    if name.endswith(".kv_scale"):
        _log_once(logging.WARNING, "DEPRECATED. Found kv_scale in the checkpoint; it is loaded as k_scale "
                  "(and v_scale duplicates it). Use separate k_scale and v_scale tensors.")
        remapped = name.replace(".kv_scale", ".attn.k_scale")
        if remapped not in params_dict:
            _log_once(logging.WARNING, "Found kv_scale in the checkpoint (e.g. %s) but the model has no %s; "
                      "kv_scale is not loaded.", name, remapped)
            return None
        return remapped
    attn = "mla_attn.mla_attn" if any("mla_attn" in k for k in params_dict) else "attn"
    if name.endswith(_KV_SCALE_SUFFIXES):
        for pattern, repl in _PATTERNS[attn]:
            if pattern.search(name):
                remapped = pattern.sub(repl, name)
                if remapped not in params_dict:
                    kind = name.split(".")[-1]
                    _log_once(logging.WARNING, "Found %s in the checkpoint (e.g. %s) but the model has no %s; "
                              "%s is not loaded.", kind, name, remapped, kind)
                    return None
                return remapped
    return name


_MOE_EXPERT_SUFFIXES = ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_input_scale",
                        "w2_input_scale", "w13_bias", "w2_bias", "w13_scale", "w2_scale", "w13_g_idx", "w2_g_idx",
                        "w13_qweight", "w2_qweight", "w13_qzeros", "w2_qzeros", "w13_weight_shape",
                        "w2_weight_shape")


def maybe_remap_moe_expert_param_name(name: str, params_dict: dict) -> str:
    """'...experts.w13_weight' -> '...experts.routed_experts.w13_weight' when the
    model has the latter (the newer fused-MoE module layout); else unchanged."""
    if ".experts." not in name or ".experts.routed_experts." in name:
        return name
    if not any(f".{s}" in name or name.endswith(s) for s in _MOE_EXPERT_SUFFIXES):
        return name
    new_name = name.replace(".experts.", ".experts.routed_experts.", 1)
    return new_name if new_name in params_dict else name


def remap_moe_expert_weights(weights: Iterable[tuple[str, torch.Tensor]],
                             params_dict: dict) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Wraps a weights iterator, remapping MoE expert names as above."""
    for name, weight in weights:
        yield maybe_remap_moe_expert_param_name(name, params_dict), weight


# ---- Hugging Face Hub ---------------------------------------------------------------------------------
#
# The downloads run in C++ (libcurl; parallel ranged requests for large files)
# into the very cache huggingface_hub uses. huggingface_hub itself is optional:
# when it is installed its HF_HUB_OFFLINE constant is honoured (as the
# reference does) and an offline miss raises its LocalEntryNotFoundError.


def _hf_offline() -> bool | None:
    try:
        import huggingface_hub.constants as c
    except ImportError:
        return None  # the engine reads $HF_HUB_OFFLINE itself
    return bool(c.HF_HUB_OFFLINE)


def _offline_miss(e: FileNotFoundError, offline: bool | None) -> Exception:
    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    if offline:
        try:
            from huggingface_hub.utils import LocalEntryNotFoundError
        except ImportError:
            return e
        return LocalEntryNotFoundError(str(e))
    return e


def _log_lines(lines) -> None:
    for line in lines:
        logger.info("%s", line)


def download_weights_from_hf(
    model_name_or_path: str,
    cache_dir: str | None,
    allow_patterns: list[str],
    revision: str | None = None,
    subfolder: str | None = None,
    ignore_patterns: str | list[str] | None = None,
) -> str:
    """Downloads a model's weight files into the Hub cache and returns the
    snapshot folder. With "*.safetensors" allowed and an index in the repo,
    exactly the files its weight_map names are fetched; otherwise the first
    allowed pattern that matches a file of the repo. Offline, only the cache
    is used (LocalEntryNotFoundError when the files are not there). Holds the
    model's lock (get_lock) while downloading."""
    assert len(allow_patterns) > 0
    if isinstance(ignore_patterns, str):
        ignore_patterns = [ignore_patterns]
    offline = _hf_offline()
    start = time.perf_counter()
    try:
        folder, lines = _core.download_weights_from_hf(
            model_name_or_path, list(allow_patterns), revision or "main", list(ignore_patterns or []),
            os.fspath(cache_dir) if cache_dir else "", offline, subfolder or "")
    except FileNotFoundError as e:
        raise _offline_miss(e, offline) from None
    _log_lines(lines)
    took = time.perf_counter() - start
    if took > 0.5:
        logger.info("Time spent downloading weights for %s: %.6f seconds", model_name_or_path, took)
    return folder


def download_safetensors_index_file_from_hf(
    model_name_or_path: str,
    index_file: str,
    cache_dir: str | None,
    subfolder: str | None = None,
    revision: str | None = None,
) -> None:
    """Fetches the safetensors index into the cache when the repo has one; a
    missing index (remote, or offline in the cache) is only logged."""
    lines = _core.download_safetensors_index_file_from_hf(
        model_name_or_path, index_file, revision or "main", os.fspath(cache_dir) if cache_dir else "",
        _hf_offline(), subfolder or "")
    _log_lines(lines)
