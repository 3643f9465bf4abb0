"""vLLM's weight utilities (vllm/model_executor/model_loader/weight_utils.py),
same names, arguments and results, on weightlift's C++ engine.

Replace `from vllm.model_executor.model_loader.weight_utils import X` with
`from weightlift.vllm_compat import X`: weightlift.vllm_compat is this
module under another name (one namespace, as vLLM's module is one, so that
a name patched there is the one every function here reads). Every iterator
is one engine load (_engine.iterate): the C++ loader runs on a background
thread, GIL released, and yields (name, torch.Tensor). Safetensors, PyTorch
and .npy tensors stored contiguously are zero-copy views of a private
copy-on-write mapping of their file whose pages the engine mapped in ahead
of you, so they are writable, never alias the file, and a copy out of them
(a weight loader's) touches no fresh memory. Every rule (auto prefetch, file
order, the expert filter, dummy values, name remapping, lock names, quant
configs) lives in C++.

A façade: it only imports downward (docs/python.md, "Extending it"). It
holds vLLM's iterators and the names vLLM's tests patch here
(_get_fs_type, _get_available_ram_bytes, _get_checkpoints_size_bytes,
_prefetch_all_checkpoints, get_tensor_model_parallel_rank and _world_size,
get_world_group) with the functions that read them at call time;
everything else is re-exported from the modules that own it.
"""
from __future__ import annotations

import logging
import os
import random
from collections.abc import Generator
from types import SimpleNamespace

import torch

from . import _distributed, _engine, _files, _gpu, _log, _prefetch
from ._configs import (  # noqa: F401
    QuantizationConfigResult,
    get_quant_config,
    get_sparse_attention_config,
)
from ._engine import BAR_FORMAT as _BAR_FORMAT  # noqa: F401
from ._engine import LOOKAHEAD_BYTES as _LOOKAHEAD_BYTES  # noqa: F401
from ._engine import enable_tqdm
from ._engine import options as _options  # noqa: F401
from ._files import (  # noqa: F401
    atomic_writer,
    convert_bin_to_safetensor_file,
    filter_duplicate_safetensors_files,
    filter_files_not_needed_for_inference,
    get_lock,
    temp_dir,
)
from ._files import natural_sort_key as _natural_sort_key  # noqa: F401
from ._files import shared_pointers as _shared_pointers  # noqa: F401
from ._gpu import fastsafetensors_weights_iterator, instanttensor_weights_iterator  # noqa: F401
from ._hub import (  # noqa: F401
    download_safetensors_index_file_from_hf,
    download_weights_from_hf,
    enable_xet_high_performance,
    maybe_download_from_modelscope,
)
from ._log import logger  # noqa: F401
from ._objstore import runai_safetensors_weights_iterator  # noqa: F401
from ._params import (  # noqa: F401
    LoaderFunction,
    composed_weight_loader,
    convert_pyslice_to_tensor,
    copy_weight_,
    default_weight_loader,
    initialize_dummy_weights,
    initialize_single_dummy_weight,
    maybe_remap_kv_scale_name,
    maybe_remap_moe_expert_param_name,
    remap_moe_expert_weights,
)
from ._vllm_extras import (  # noqa: F401  (vLLM 0.32-0.34's names beyond the reference)
    DisabledTqdm,
    _local_snapshot_dirs,
    drop_checkpoint_cache,
    filter_mm_encoder_only_safetensors_files,
    filter_safetensors_files_by_weight_name,
    finalize_model_weights,
    resolve_mm_encoder_only_lm_prefixes,
)
from .ep_weight_filter import (  # noqa: F401  (vLLM's weight_utils imports them)
    compute_eplb_local_expert_ids,
    compute_local_expert_ids,
    parse_expert_id,
    should_skip_weight,
)

DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS = _prefetch.DEFAULT_NUM_THREADS
DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE = _prefetch.DEFAULT_BLOCK_SIZE
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# ---- prefetch (network filesystems) ----------------------------------------------------
# The reference's private names, which vLLM's tests patch here. The facts,
# the rule (as a load decides it: a dry run of the engine's plan) and the
# prefetcher are the engine's (_prefetch: system.h, prefetch.h, load_plan.h).

_get_checkpoints_size_bytes = _prefetch.checkpoints_size_bytes
# Available host memory, cgroup limits honoured: vLLM 0.34's name
# (vllm.utils.cpu_resource_utils), and 0.32's private one.
get_available_memory = _prefetch.available_ram_bytes
_get_available_ram_bytes = _prefetch.available_ram_bytes
_get_fs_type = _prefetch.fs_type
_prefetch_checkpoint = _prefetch.prefetch_checkpoint
_prefetch_all_checkpoints = _prefetch.prefetch_all
_prefetchers = _prefetch.prefetchers


def _prefetch_decision(files: list[str], requested: bool):
    """The prefetch rule as the engine's plan decides it, in one engine call
    (a dry run of the load). A fact helper above that was
    replaced (vLLM's tests patch them) is asked here and its answer passed
    in; the engine measures the others itself."""
    known = {}
    if _get_fs_type is not _prefetch.fs_type:
        known["fstype"] = _get_fs_type(files)
    if _get_checkpoints_size_bytes is not _prefetch.checkpoints_size_bytes:
        known["checkpoint_bytes"] = _get_checkpoints_size_bytes(files)
    if get_available_memory is not _prefetch.available_ram_bytes:
        known["available_bytes"] = get_available_memory()
    elif _get_available_ram_bytes is not _prefetch.available_ram_bytes:
        known["available_bytes"] = _get_available_ram_bytes()
    return _prefetch.decide(files, requested, **known)


# ---- iterators ------------------------------------------------------------------------------

# vLLM's safetensors_load_strategy: None (the engine's auto rule), torchao,
# or one of the engine's per-file strategies, by the engine's own names.
_STRATEGIES = (None, *(s for s in _engine.STRATEGIES if s in ("lazy", "eager", "prefetch")), "torchao")


def safetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    safetensors_load_strategy: str | None = None,
    local_expert_ids: set[int] | None = None,
    *,
    safetensors_prefetch_num_threads: int = DEFAULT_SAFETENSORS_PREFETCH_NUM_THREADS,
    safetensors_prefetch_block_size: int = DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE,
    shuffle_safetensors_files: bool = False,
    distributed: bool | None = None,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) for every tensor of the files, files in natural
    order (shuffle_safetensors_files: in _shuffle_files' rank-seeded order),
    names sorted within a file (as safe_open().keys()).

    Strategies: None (lazy; prefetch first when the files are on NFS/Lustre and
    fit in 90% of free RAM), "lazy" (each tensor's pages mapped in as it comes),
    "eager" (each file mapped in whole before its first tensor), "prefetch"
    (page-cache prefetch in the background, then lazy), "torchao" (rebuilds
    torchao tensor subclasses; needs torchao>=0.15). With local_expert_ids,
    other ranks' expert weights are skipped unread.

    distributed (or WEIGHTLIFT_DISTRIBUTED=1 when None): with
    torch.distributed initialised on more than one rank, the ranks read the
    files once in total and exchange over the process group
    (weightlift._distributed); tensors then come as they complete."""
    if safetensors_load_strategy not in _STRATEGIES:
        raise ValueError(f"unknown safetensors_load_strategy {safetensors_load_strategy!r} "
                         f"(expected one of None, 'lazy', 'eager', 'prefetch', 'torchao')")
    desc = "Loading safetensors checkpoint shards"
    if safetensors_load_strategy == "eager":
        desc += " (eager)"
    sorted_files = _files.natural_sort(hf_weights_files)
    group = _distributed.requested_group(distributed) if safetensors_load_strategy != "torchao" else None
    if group is not None:
        yield from _distributed.distributed_weights_iterator(sorted_files, use_tqdm_on_load, group=group,
                                                             local_expert_ids=local_expert_ids)
        return

    prefetch = False
    if safetensors_load_strategy in (None, "prefetch"):
        decision = _prefetch_decision(sorted_files, safetensors_load_strategy == "prefetch")
        _log.log_once(logging.WARNING if decision.warn else logging.INFO, "%s", decision.reason)
        prefetch = decision.prefetch
        if prefetch:
            _prefetch_all_checkpoints(sorted_files, num_prefetch_threads=safetensors_prefetch_num_threads,
                                      block_size=safetensors_prefetch_block_size)
    if shuffle_safetensors_files:
        sorted_files = _shuffle_files(sorted_files)

    if safetensors_load_strategy == "torchao":
        yield from _torchao_iterator(sorted_files, local_expert_ids, desc, use_tqdm_on_load)
        return
    # While a prefetch fills the page cache, views of it (direct "off": the
    # engine does not read cold files around the cache instead).
    yield from _engine.iterate(sorted_files, desc=desc, use_tqdm_on_load=use_tqdm_on_load,
                               strategy="eager" if safetensors_load_strategy == "eager" else "lazy", order="name",
                               file_views=True, local_expert_ids=local_expert_ids,
                               direct="off" if prefetch else None)


def _torchao_iterator(files, local_expert_ids, desc, use_tqdm_on_load):
    """File by file, torchao's flattened tensor subclasses rebuilt with the
    file's metadata (a subclass split over files waits for its other parts)."""
    try:
        import torchao  # noqa: F401
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict
    except ImportError as e:
        raise ValueError("Please use torchao version >= 0.15.0 to load torchao safetensors checkpoint") from e
    leftover: dict[str, torch.Tensor] = {}
    for st_file in _engine.progress_bar(files, desc=desc, disable=not enable_tqdm(use_tqdm_on_load)):
        state = dict(_engine.iterate([st_file], strategy="lazy", order="name", file_views=True,
                                     local_expert_ids=local_expert_ids))
        state.update(leftover)
        metadata = _engine.safetensors_metadata(st_file)
        unflat, leftover = unflatten_tensor_state_dict(state, metadata)
        yield from unflat.items()


def _check_workers(max_workers: int) -> None:
    if max_workers < 1:
        raise ValueError(f"max_workers must be greater than 0, got {max_workers}")


def multi_thread_safetensors_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    max_workers: int = 4,
    shuffle_safetensors_files: bool = False,
    *,
    distributed: bool | None = None,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """`max_workers` engine threads each take whole files and map their
    tensors in; tensors come as they are ready (a file's in offset order, as
    safetensors' load_file gives them; files may interleave), files started
    in the order given (shuffle_safetensors_files: _shuffle_files' order).
    distributed (keyword only: vLLM 0.34's fourth positional parameter is
    the shuffle): as safetensors_weights_iterator."""
    _check_workers(max_workers)
    if shuffle_safetensors_files:
        hf_weights_files = _shuffle_files(hf_weights_files)
    group = _distributed.requested_group(distributed)
    if group is not None:
        yield from _distributed.distributed_weights_iterator(list(hf_weights_files), use_tqdm_on_load, group=group,
                                                             threads=max_workers)
        return
    yield from _engine.iterate(list(hf_weights_files), desc="Multi-thread loading shards",
                               use_tqdm_on_load=use_tqdm_on_load, ordered=False, strategy="threads",
                               threads=max_workers, order="offset", file_views=True)


def _pt_on_engine(pt_load_map_location) -> bool:
    return pt_load_map_location in ("cpu", None) or str(pt_load_map_location) == "cpu"


def _pt_items(bin_file: str, pt_load_map_location):
    """A file's (name, tensor) for a map location other than "cpu": one CUDA
    device through our own reader (nothing unpickled), else torch.load."""
    items = _gpu.pt_items_on_device(bin_file, pt_load_map_location)
    if items is not None:
        return items
    return list(torch.load(bin_file, map_location=pt_load_map_location, weights_only=True).items())


def pt_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    pt_load_map_location: str | dict[str, str] = "cpu",
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Yields (name, tensor) of PyTorch .bin/.pt files, one file at a time, in
    each file's pickle order (the C++ reader: nothing is unpickled; torch.load
    only for a map location other than "cpu")."""
    desc = "Loading pt checkpoint shards"
    if _pt_on_engine(pt_load_map_location):
        yield from _engine.iterate(list(hf_weights_files), desc=desc, use_tqdm_on_load=use_tqdm_on_load,
                                   strategy="lazy", order="listed", file_views=True)
        return
    for bin_file in _engine.progress_bar(hf_weights_files, desc=desc, disable=not enable_tqdm(use_tqdm_on_load)):
        yield from _pt_items(bin_file, pt_load_map_location)


def multi_thread_pt_weights_iterator(
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
    pt_load_map_location: str | dict[str, str] = "cpu",
    max_workers: int = 4,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """PyTorch files on `max_workers` engine threads, tensors as they are ready."""
    _check_workers(max_workers)
    desc = "Multi-thread loading pt checkpoint shards"
    if _pt_on_engine(pt_load_map_location):
        yield from _engine.iterate(list(hf_weights_files), desc=desc, use_tqdm_on_load=use_tqdm_on_load,
                                   ordered=False, strategy="threads", threads=max_workers, order="listed",
                                   file_views=True)
        return
    for bin_file in _engine.progress_bar(hf_weights_files, desc=desc, disable=not enable_tqdm(use_tqdm_on_load)):
        yield from _pt_items(bin_file, pt_load_map_location)


def np_cache_weights_iterator(
    model_name_or_path: str,
    cache_dir: str | None,
    hf_folder: str,
    hf_weights_files: list[str],
    use_tqdm_on_load: bool,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """Converts the weight files to one .npy per tensor under <hf_folder>/np
    (once, by the first process, under the model's lock: get_lock's file),
    then yields them from there in dump order through the engine (each
    tensor a view of a private mapping of its .npy file)."""
    bar = _engine.progress_bar(None, total=len(hf_weights_files), desc="Loading np_cache checkpoint shards",
                       disable=not enable_tqdm(use_tqdm_on_load))
    try:
        lock = _files.model_lock_path(model_name_or_path, cache_dir)
        np_folder, names, _ = _engine.np_cache_prepare(hf_weights_files, hf_folder, lock)
        bar.update(len(hf_weights_files))
    finally:
        bar.close()
    paths = {os.path.join(np_folder, name): name for name in names}
    yield from _engine.iterate(list(paths), rename=paths, strategy="lazy", order="listed", file_views=True)


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
    in the engine's order (file order for lazy/eager); `path_or_files` is a
    model folder, a file, or a list of files.

    strategy and `engine` are the C++ loader's options (see docs/engine.md):
    strategy lazy | eager | prefetch | auto | threads | stream; threads,
    block_size, rank, world_size (prefetch striping), tp_rank, tp_size,
    shard_rules (["*.q_proj.weight:0", ...]: read only this rank's slice),
    max_memory, direct ("auto" | "on" | "off"), order ("offset" | "name" |
    "listed"), file_views (default True: tensors are views of a private file
    mapping; False: each tensor in memory of its own). With
    local_expert_ids, other ranks' expert weights are skipped unread."""
    files = _files.weight_files(path_or_files)
    engine.setdefault("file_views", True)
    yield from _engine.iterate(files, desc="Loading safetensors checkpoint shards", use_tqdm_on_load=use_tqdm_on_load,
                               max_queued_bytes=max_queued_bytes, ordered=False, strategy=strategy,
                               local_expert_ids=local_expert_ids, **engine)


# ---- tensor-parallel weight loaders -------------------------------------------------------------
# Here, not in _params, because vLLM's tests patch get_tensor_model_parallel_rank here.


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


def get_tensor_model_parallel_world_size() -> int:
    """vLLM's TP world size when vLLM's parallel state is set up, else the
    torch.distributed world size, else 1."""
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size as vllm_size

        return vllm_size()
    except Exception:
        pass
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def get_world_group():
    """The world group as vLLM's weight_utils reads it (`.rank`,
    `.world_size`): vLLM's group coordinator when vLLM's parallel state is set
    up, else torch.distributed's world, else a single rank."""
    try:
        from vllm.distributed import get_world_group as vllm_world_group

        return vllm_world_group()
    except Exception:
        pass
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return SimpleNamespace(rank=dist.get_rank(), world_size=dist.get_world_size())
    return SimpleNamespace(rank=0, world_size=1)


def _shuffle_files(files: list[str]) -> list[str]:
    """`files` in natural order, then shuffled by random.Random(world rank)
    (vLLM 0.34's shuffle_safetensors_files: each rank its own order, the same
    permutation as vLLM's for the same rank and files)."""
    rank = get_world_group().rank
    shuffled = sorted(files, key=_natural_sort_key)
    random.Random(rank).shuffle(shuffled)
    logger.info("Shuffled %d safetensors files with seed %d", len(shuffled), rank)
    return shuffled


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


def load_attention_sink(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """A global attention sink (one value per head) into this TP rank's
    parameter: its heads (ValueError when the heads do not split evenly over
    the ranks), the parameter's padding heads set to -inf."""
    tp_size = get_tensor_model_parallel_world_size()
    heads = loaded_weight.numel()
    if heads % tp_size:
        raise ValueError(f"Attention sink heads ({heads}) must be divisible by tp_size ({tp_size})")
    local = heads // tp_size
    default_weight_loader(param[:local], loaded_weight.narrow(0, get_tensor_model_parallel_rank() * local, local))
    param.data[local:].fill_(-float("inf"))


def make_attention_sink(num_heads: int, dtype: torch.dtype | None = None) -> torch.nn.Parameter:
    """A sink parameter of `num_heads` values, all -inf, loaded by load_attention_sink."""
    sink = torch.nn.Parameter(torch.full((num_heads,), -float("inf"), dtype=dtype), requires_grad=False)
    sink.weight_loader = load_attention_sink
    return sink
