"""The bridge to the engine: the one module that calls weightlift._core for
loads, and for the engine's rules over files and names.

    options(**kw)            typed LoadOptions from keyword arguments
    describe(files, **kw)    a dry run: what a load of `files` would decide (its plan)
    decide_prefetch(...)     the prefetch rule as a load decides it (a dry run)
    open_stream(files)       the engine's background load (_core.Stream; its plan's log comes back with it)
    read_ahead(files)        a load's reads started before the load (_core.ReadAhead)
    prefaulter()             first touch of the caller's memory ahead of the load (_core.Prefaulter)
    populate_read(ranges)    memory mapped onto files brought in before the load returns
    iterate(files)           the load as (name, torch.Tensor), with its progress bar
    tensors(stream, files)   the same over a stream already open
    load_into(files, ...)    straight into the caller's tensors
    progress_bar(...)        the package's bar (tqdm, or nothing when disabled)
    enable_tqdm(flag)        bars only when asked and only on rank 0

and the engine's vocabulary (STRATEGIES, OBJECT_SCHEMES, its errors), its
files (listing, small reads, the weight-file rules, the NumPy cache), its
facts (filesystem, sizes, memory), the page-cache prefetcher, the rules
over names (experts, dummy values, remapping) and its rendering of outside
text (inert_text, which weightlift._text offers the package).

and, for weightlift.safetensors (the safetensors package's API), the same
engine one file at a time:

    safetensors_file(path, strategy, file_views)  a handle reading tensors as asked
    device_stream(path, device, only, rows, threads)  a file's tensors into a CUDA device
    tensor_to_device(handle, name, rows, device)  one tensor of an open handle into a CUDA device
    parse_safetensors(data) / serialize(...) / serialize_file(...)  files held in memory, the writer

Every iterator of the package (weight_utils, _gpu, _hub, _distributed,
_objstore, load_into, the vLLM plug-in) reads through iterate() or
load_into(); a new one is iterate() with its engine options and its bar
text (docs/python.md, "Extending it"). Besides this module only the
families with bindings of their own call _core (_hub: the Hub;
_distributed: collectives; _gpu: devices; _configs: quant configs), which
tests/python/test_package_layers.py checks; weightlift.safetensors (_st)
reads through the functions below.

The bridge floor: imports only the ground (_core, _log, _tensors)."""
from __future__ import annotations

import os
from collections.abc import Generator, Iterable

import torch

from . import _core
from ._log import logger
from ._tensors import to_torch

# Tensors the engine may map in ahead of the consumer (page-cache pages
# mapped into this process, counted in its RSS until consumed).
LOOKAHEAD_BYTES = 64 << 20

# Plain text, one line per update: readable under Ray / multiprocessing log prefixes.
BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"

# ---- the engine's vocabulary ---------------------------------------------------------------

CancelledError = _core.CancelledError
CorruptDataError = _core.CorruptDataError
# The engine's strategies (read_path.h): the one list the options, the CLI and the plug-in take.
STRATEGIES: tuple[str, ...] = tuple(_core.strategy_names())
# URL schemes the engine reads as object storage (s3.h), with their "://".
OBJECT_SCHEMES: tuple[str, ...] = tuple(s + "://" for s in _core.object_storage_schemes())


def is_object_url(path) -> bool:
    """True for an object-storage URL the engine reads (s3://, gs://)."""
    return isinstance(path, str) and path.lower().startswith(OBJECT_SCHEMES)


# ---- options, plans and the stream ------------------------------------------------------------


def options(**kwargs) -> _core.LoadOptions:
    """The engine's typed options from keyword arguments (strategy, threads,
    block_size, shard_rules, local_expert_ids, max_memory, direct, order,
    file_views, device, gds, collective, ...); None leaves a default. An
    option the engine does not have is a ValueError naming it."""
    o = _core.LoadOptions()
    for key, value in kwargs.items():
        if value is None and key not in ("local_expert_ids", "collective", "read_ahead"):
            continue
        if key == "local_expert_ids" and value is not None:
            value = set(value)
        try:
            setattr(o, key, value)
        except AttributeError:
            raise ValueError(f"the loader has no option '{key}'") from None
    return o


def describe(files: Iterable[str], *, fs_type: str | None = None, checkpoint_bytes: int | None = None,
             available_bytes: int | None = None, cached_fraction: float | None = None, **kwargs) -> dict:
    """A dry run: the plan a load of `files` with these options() would make
    (the engine's plan_load(), nothing read beyond the headers), as a dict:
    strategy, direct, file_views, gds, ordered, max_memory, threads,
    read_size, window, copy_source, workers, log (the reasons), warnings and
    text (describe()). Facts given win over what the engine would find out."""
    return _core.describe_load([os.fspath(f) for f in files], options(**kwargs), fs_type=fs_type,
                               checkpoint_bytes=checkpoint_bytes, available_bytes=available_bytes,
                               cached_fraction=cached_fraction)


def decide_prefetch(files: list[str], requested: bool, **known) -> _core.PrefetchDecision:
    """The prefetch rule as a load of `files` decides it (a dry run):
    prefetch when they sit on a network filesystem and fit in 90% of the
    available RAM, always when `requested` (a warning when they do not fit).
    `known`: facts the caller already holds (fstype, checkpoint_bytes,
    available_bytes); the engine finds out the others. The answer's
    .prefetch, .warn, .reason (one line for the log) and the facts it used."""
    return _core.decide_prefetch([os.fspath(f) for f in files], requested, **known)


def prefetch_decision(fstype: str, checkpoint_bytes: int, available_bytes: int, requested: bool):
    """The prefetch rule over facts given: (prefetch, warn, reason)."""
    return _core.prefetch_decision(fstype, checkpoint_bytes, available_bytes, requested)


def open_stream(files: Iterable[str], *, max_queued_bytes: int, ordered: bool = False,
                only: Iterable[str] | None = None, exclude: Iterable[str] | None = None, **kwargs) -> _core.Stream:
    """Starts a load of `files` on an engine thread (plan_load, then
    execute). Iterating the stream gives (name, file, dtype, shape, bytes) as
    tensors are handed over (in checkpoint order when `ordered`); at most
    `max_queued_bytes` of finished tensors wait for the consumer.
    `only`/`exclude` limit the tensors read; the other keywords are
    options(). stream.log() gives the lines the engine logged (the plan's
    reasons first), stream.describe() the plan that runs."""
    return _core.Stream([os.fspath(f) for f in files], options(**kwargs), max_queued_bytes,
                        None if only is None else list(only), None if exclude is None else list(exclude), ordered)


def load_into(files: Iterable[str], targets: list, **kwargs) -> dict:
    """The engine reads each named tensor of `files` straight into the memory
    of its target: [(name, data_ptr, nbytes, dtype name, shape)] of tensors
    the caller keeps alive for the call, all on options' device. Returns the
    engine's figures, "log" (the lines it logged, the plan's reasons first)
    and "plan" (the plan that ran, as describe() gives it)."""
    return _core.load_into([os.fspath(f) for f in files], options(**kwargs), targets)


def read_ahead(files: Iterable[str], *, threads: int = 0, block_size: int = 0, max_memory: int = 0, rank: int = 0,
               world_size: int = 1, local_expert_ids: Iterable[int] | None = None,
               only: Iterable[str] | None = None, first: Iterable[str] | None = None) -> _core.ReadAhead:
    """Starts reading, on engine threads, the bytes a later load of `files`
    will need (include/weightlift/read_ahead.h): local files into the page
    cache, remote ones into staging that a load given the engine option
    `read_ahead=<this>` consumes. With world_size > 1 this rank's 1/world_size
    of the bytes; expert tensors not in local_expert_ids are never read;
    `only`: these tensors alone (by name); `first`: these before the others
    (two passes, each split among the ranks); bounded by max_memory (0: the
    engine's bound, admitting the first pass first). progress() tells how
    far it got; stop() ends it early; dropping it frees its staging."""
    experts = None if local_expert_ids is None else set(local_expert_ids)
    names = None if only is None else [str(n) for n in only]
    sooner = None if first is None else [str(n) for n in first]
    return _core.ReadAhead.start([os.fspath(f) for f in files], threads, block_size, max_memory, rank, world_size,
                                 experts, names, sooner)


def prefaulter(huge_pages: bool | None = None) -> _core.Prefaulter:
    """A background thread that faults in host memory a later load will fill
    (destination.h's Prefaulter): add(data_ptr, nbytes) as the memory is
    allocated, stop() before the load. huge_pages (default: when
    WEIGHTLIFT_CALLER_HUGE_PAGES=1, as the engine's caller destination)
    advises each range for transparent huge pages first. Never changes a byte."""
    if huge_pages is None:
        huge_pages = os.environ.get("WEIGHTLIFT_CALLER_HUGE_PAGES") == "1"
    return _core.Prefaulter(bool(huge_pages))


def populate_read(ranges: Iterable[tuple[int, int]], threads: int = 0) -> dict:
    """Every page of the (address, nbytes) ranges, memory mapped onto files
    (parameters made views of a checkpoint's pages), read in where the page
    cache lacks it and mapped into this process, `threads` at a time (0: 4),
    the GIL released: a load that returns leaves no read to the first access
    (read_ahead.h). {bytes, bytes_not_resident, seconds}; OSError naming the
    range's index when a file was truncated under its mapping."""
    return _core.populate_read([(int(a), int(n)) for a, n in ranges], threads)


# ---- progress ----------------------------------------------------------------------------


class NoBar:
    """What a disabled bar is: tqdm(disable=True) still starts its monitor
    thread and takes a multiprocessing lock (about 2 ms per iterator)."""

    n = 0
    total = None

    def __init__(self, iterable=None):
        self._iterable = iterable

    def __iter__(self):
        return iter(self._iterable)

    def update(self, n=1):
        pass

    def refresh(self):
        pass

    def close(self):
        pass


def progress_bar(iterable, **kwargs):
    """tqdm(iterable, **kwargs) in the reference's one-line format (unless
    `bar_format` is given), or a NoBar when `disable`."""
    if kwargs.get("disable"):
        return NoBar(iterable)
    from tqdm.auto import tqdm

    kwargs.setdefault("bar_format", BAR_FORMAT)
    return tqdm(iterable, **kwargs)


def enable_tqdm(use_tqdm_on_load: bool) -> bool:
    """Show a bar only when asked and only on rank 0 of torch.distributed."""
    return bool(use_tqdm_on_load) and (
        not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or torch.distributed.get_rank() == 0
    )


# ---- the load as torch tensors ------------------------------------------------------------


def iterate(files: Iterable[str], *, desc: str = "", use_tqdm_on_load: bool = False, bar_per: str = "file",
            bar_options: dict | None = None, max_queued_bytes: int = LOOKAHEAD_BYTES, ordered: bool = True,
            only: Iterable[str] | None = None, exclude: Iterable[str] | None = None,
            rename: dict[str, str] | None = None, raw_dtypes: bool | None = None, stats: dict | None = None,
            **engine) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Runs one engine load over `files` and yields (name, torch.Tensor) as
    the engine hands them over: zero-copy over the engine's memory (host,
    pinned or device), in checkpoint order when `ordered` (files as given,
    each file's tensors in the `order` option) even where the engine
    finishes them out of order, else as they finish.

    engine: options() (strategy, order, file_views, threads, device, gds,
    collective, local_expert_ids, ...); only / exclude: the tensors read;
    rename: file -> the name to yield for its (single) tensor; raw_dtypes:
    as _tensors.to_torch; stats: filled with the engine's figures once the
    load completed (its "log": the lines the engine logged). The bar (when
    `desc` is set and enable_tqdm allows): bar_per "file" counts files done,
    a line at the start, one per file and one at the close, as the
    reference's tqdm over its file list prints; "tensor" counts tensors, its
    total the engine's count once the load is planned; bar_options go to tqdm."""
    files = [os.fspath(f) for f in files]
    if bar_per not in ("file", "tensor"):
        raise ValueError(f"bar_per must be 'file' or 'tensor', not {bar_per!r}")
    stream = open_stream(files, max_queued_bytes=max_queued_bytes, ordered=ordered, only=only, exclude=exclude,
                         **engine)
    yield from tensors(stream, files, desc=desc, use_tqdm_on_load=use_tqdm_on_load, bar_per=bar_per,
                       bar_options=bar_options, rename=rename, raw_dtypes=raw_dtypes, stats=stats)


def tensors(stream: _core.Stream, files: list[str], *, desc: str = "", use_tqdm_on_load: bool = False,
            bar_per: str = "file", bar_options: dict | None = None, rename: dict[str, str] | None = None,
            raw_dtypes: bool | None = None,
            stats: dict | None = None) -> Generator[tuple[str, torch.Tensor], None, None]:
    """iterate() over a stream already open (a caller that starts the
    engine's threads under its own CPU affinity); closes the stream."""
    per_file = bar_per == "file"
    shown = bool(desc) and enable_tqdm(use_tqdm_on_load)
    bar = progress_bar(None, total=len(files) if per_file else None, desc=desc, disable=not shown,
                       **(bar_options or {}))
    seen: set[str] = set()
    try:
        for name, file, dtype, shape, data in stream:
            if file not in seen:
                seen.add(file)
                drain_logs()
                if per_file and len(seen) > 1:
                    bar.update(1)  # the previous file is done: a line per file, as vLLM's tqdm over files
            if shown and not per_file:
                if bar.total is None:
                    bar.total = stream.progress()["tensors_total"]
                bar.update(1)
            yield (rename[file] if rename else name), to_torch(dtype, shape, data, name, file, raw_dtypes)
        if per_file:
            bar.update(len(files) - max(len(seen) - 1, 0))
        if stats is not None:
            stats.update(stream.progress())
    finally:
        stream.close()
        bar.close()


# ---- files through the engine (local paths and URLs) ---------------------------------------


def list_tensors(files: Iterable[str]) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every tensor of the files (headers only), in each file's listing order."""
    return _core.list_tensors([os.fspath(f) for f in files])


def list_dir(path: str) -> list[tuple[str, bool, int]]:
    """(name, is_dir, size) of a folder or an object-store prefix, sorted by name."""
    return _core.env_list_dir(os.fspath(path))


def read_small_file(path: str, max_bytes: int) -> bytes:
    """A whole small file (configs, tokenizers) through the engine's sources;
    larger than max_bytes is a ValueError before anything is read."""
    return _core.env_read_file(os.fspath(path), max_bytes)


def find_weight_files(path) -> tuple[list[str], str]:
    """The weights of a model folder or prefix as the engine picks them
    (index, else *.safetensors, *.bin, *.pt; training files dropped; natural
    order) and their format ("safetensors", "pytorch", "numpy")."""
    return _core.find_weight_files(os.fspath(path))


def natural_sort(files: Iterable[str]) -> list[str]:
    return _core.natural_sort([os.fspath(f) for f in files])


def natural_key(name: str):
    return _core.natural_key(name)


def filter_duplicate_safetensors_files(files: list[str], folder: str, index_file: str) -> list[str]:
    return _core.filter_duplicate_safetensors_files(list(files), os.fspath(folder), index_file)


def filter_files_not_needed_for_inference(files: list[str]) -> list[str]:
    return _core.filter_files_not_needed_for_inference(list(files))


def model_lock_path(model: str, lock_dir: str) -> str:
    return _core.model_lock_path(model, lock_dir)


def convert_pytorch_to_safetensors(pt_file: str, sf_file: str) -> dict:
    return _core.convert_pytorch_to_safetensors(os.fspath(pt_file), os.fspath(sf_file))


def np_cache_prepare(files: list[str], folder: str, lock: str):
    """The NumPy cache of the files under <folder>/np, made once under `lock`: (folder, names, made)."""
    return _core.np_cache_prepare([os.fspath(f) for f in files], os.fspath(folder), lock)


def safetensors_metadata(path: str) -> dict | None:
    """The __metadata__ of a safetensors file's header (None when it has none)."""
    return _core.SafetensorsFile(os.fspath(path), "lazy").metadata() or None


def read_tensor(path: str, offset: int, dtype: str, shape, device: str):
    """(dtype, shape, bytes) of the tensor at `offset` of `path`, on `device`
    ("cpu", "pinned", "cuda:N": through the engine's pinned ring)."""
    return _core.read_to_device(os.fspath(path), offset, dtype, list(shape), device)


def cached_snapshot(model: str, patterns: list[str], revision: str | None, cache_dir: str | None) -> str:
    """The Hub cache's snapshot folder of `model` holding `patterns`, offline
    (nothing is downloaded); FileNotFoundError when it is not there."""
    folder, _ = _core.download_weights_from_hf(model, list(patterns), revision or "main", [],
                                               os.fspath(cache_dir) if cache_dir else "", True, "")
    return folder


# ---- the facts a load is decided on ---------------------------------------------------------


def checkpoint_size_bytes(files: list[str]) -> int:
    return _core.checkpoint_size_bytes([os.fspath(f) for f in files])


def available_ram_bytes() -> int:
    """MemAvailable, bounded by the cgroup's remaining limit when there is one."""
    return _core.available_ram_bytes()


def filesystem_type(path: str) -> str:
    return _core.filesystem_type(os.fspath(path))


def peak_rss_bytes() -> int:
    return _core.peak_rss_bytes()


def inert_text(text: str) -> str:
    """The engine's rendering of outside text (text.h's inert(): controls
    escaped, URL secrets redacted); weightlift._text.inert is the package's door."""
    return _core.inert_text(text)


# ---- the page-cache prefetcher ----------------------------------------------------------------

prefetchers: list = []  # running background prefetches (the reference's daemon threads); the last four kept


def prefetch_files(files: list[str], threads: int, block_size: int) -> None:
    """Reads the files once, in blocks, so that their pages sit in the page cache."""
    _core.prefetch_files([os.fspath(f) for f in files], threads, block_size)


def start_prefetch(files: list[str], threads: int, block_size: int, rank: int, world: int) -> None:
    """Starts the engine's Prefetcher over files[rank::world] in the background
    (kept in `prefetchers`); failures are only logged."""
    p = _core.Prefetcher([os.fspath(f) for f in files], threads, block_size, rank, world)
    drain_logs()
    prefetchers[:] = prefetchers[-3:] + [p]


def drain_logs() -> None:
    """Logs what the running prefetches said since the last call."""
    for p in prefetchers:
        for line in p.take_log():
            (logger.warning if line.startswith("warning:") else logger.info)("%s", line)


# ---- rules over names: experts, dummy values, remapping ---------------------------------------


def parse_expert_id(name: str) -> int | None:
    return _core.parse_expert_id(name)


def compute_local_expert_ids(num_experts: int, ep_size: int, ep_rank: int, placement: str) -> set[int] | None:
    return _core.compute_local_expert_ids(num_experts, ep_size, ep_rank, placement)


def should_skip_weight(name: str, local_expert_ids: set[int] | None) -> bool:
    return _core.should_skip_weight(name, None if local_expert_ids is None else set(local_expert_ids))


def dummy_fills(dtype: str) -> bool:
    return _core.dummy_fills(dtype)


def fill_dummy(dtype: str, ptr: int, nbytes: int, numel: int, low: float, high: float, seed: int) -> None:
    """Dummy values into host memory the caller owns (dummy.h)."""
    _core.fill_dummy(dtype, ptr, nbytes, numel, low, high, seed)


def fill_dummy_device(dtype: str, ptr: int, numel: int, low: float, high: float, seed: int, device: int) -> None:
    """Dummy values into device memory the caller owns (the CUDA kernel; the fake backend fills on the host)."""
    _core.fill_dummy_device(dtype, ptr, numel, low, high, seed, device)


def maybe_remap_kv_scale_name(name: str, params) -> tuple[str | None, list[str]]:
    return _core.maybe_remap_kv_scale_name(name, params)


def maybe_remap_moe_expert_param_name(name: str, params):
    return _core.maybe_remap_moe_expert_param_name(name, params)


# ---- one safetensors file: weightlift.safetensors --------------------------------------------

SafetensorError = _core.SafetensorError
TensorSpec = _core.TensorSpec
TensorMeta = _core.TensorMeta  # a handle's meta(name): a header entry, no data read
CorruptDataError = _core.CorruptDataError


def safetensors_file(path: str, strategy: str = "lazy", file_views: bool = True) -> _core.SafetensorsFile:
    """One safetensors file opened for reads as asked, in the engine's words:
    "lazy" with file_views (zero-copy views of a private copy-on-write
    mapping), "lazy" without (each tensor read into a buffer of its own when
    asked, nothing mapped), "eager" (the whole file read into one buffer now).
    Its header (names, dtypes, shapes, offsets, metadata) is read once."""
    return _core.SafetensorsFile(path, strategy, file_views)


def device_stream(path: str, device: str, *, only: Iterable[str] | None = None,
                  rows: dict[str, tuple[int, int]] | None = None, threads: int = 0) -> _core.Stream:
    """A load of one file's tensors into device memory (`device`: "cuda:N"),
    the engine's device path: the stream strategy through the process's one
    pinned staging ring into one device allocation (or GPUDirect Storage
    where the platform has it). `only`: the tensors read; `rows`: name ->
    (begin, end), rows of the first dimension read and handed over instead
    of the whole tensor. Tensors come as they land (not in file order); the
    stream holds those not yet taken (device memory, no host memory)."""
    return open_stream([path], max_queued_bytes=1 << 62, ordered=False, only=only, strategy="stream",
                       device=device, gds="auto", threads=threads, rows=rows or {})


def tensor_to_device(handle: _core.SafetensorsFile, name: str, rows: tuple[int, int] | None, device: str):
    """(dtype, shape, device bytes) of one tensor of an open handle (rows
    [begin, end) of its first dimension when given) read into `device`
    ("cuda:N") through the same pinned staging ring as device_stream, from
    the handle's open file: no second open, no header read again (a stream
    plans its file anew, which a file of thousands of tensors makes slow).
    A name the file lacks is the engine's not-found error."""
    return handle.to_device(name, rows, device)


def parse_safetensors(data) -> tuple[dict[str, str], list]:
    """(metadata, [(name, dtype, shape, begin, end)]) of a whole safetensors
    file held in a bytes-like object, validated as a file is."""
    return _core.parse_safetensors_bytes(data)


def serialize(tensor_dict: dict, metadata: dict[str, str] | None) -> bytes:
    """The bytes of a safetensors file holding {name: TensorSpec}."""
    return _core.serialize(tensor_dict, metadata)


def serialize_file(tensor_dict: dict, filename, metadata: dict[str, str] | None) -> None:
    """{name: TensorSpec} written to `filename` atomically (not fsynced)."""
    _core.serialize_file(tensor_dict, filename, metadata)
