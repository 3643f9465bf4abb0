"""Names vLLM's weight_utils (0.32 to 0.34) has beyond the reference, with
the same arguments and behaviour (0.34's where it changed):

    filter_safetensors_files_by_weight_name   drop shards holding only weights the model does not load
    resolve_mm_encoder_only_lm_prefixes       --mm-encoder-only: the language model's module prefixes
    filter_mm_encoder_only_safetensors_files  --mm-encoder-only: drop shards holding only LM weights
    drop_checkpoint_cache                     evict a model's safetensors files from the page cache
    finalize_model_weights                    every module's post-load hook, children first (0.34)
    DisabledTqdm                              a tqdm that never draws

Headers are read by the engine (no safetensors package needed); the index is
plain JSON. A leaf: it imports only the bridge (_engine), _log and _text.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import _engine
from ._log import log_once, logger
from ._text import refuse_duplicate_keys


def _info_once(msg: str, *args) -> None:
    log_once(logging.INFO, msg, *args)


def _warning_once(msg: str, *args) -> None:
    log_once(logging.WARNING, msg, *args)


class DisabledTqdm(tqdm):
    """tqdm with disable=True whatever the caller passes (vLLM hands it to
    huggingface_hub's downloads on ranks other than 0)."""

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def filter_safetensors_files_by_weight_name(hf_weights_files: list[str],
                                            is_unused_weight: Callable[[str], bool]) -> list[str]:
    """The shards in which `is_unused_weight` rejects at least one tensor (a
    shard all of whose tensors are unused is dropped, unread beyond its
    header); `hf_weights_files` unchanged when that would drop every shard."""
    kept = []
    for f in hf_weights_files:
        names = [n for n, _, _ in _engine.list_tensors([f])]
        if not all(is_unused_weight(n) for n in names):
            kept.append(f)
    if not kept:
        return hf_weights_files
    if len(kept) < len(hf_weights_files):
        _info_once("Skipped %d/%d safetensors shard(s) holding no weights the model loads",
                   len(hf_weights_files) - len(kept), len(hf_weights_files))
    return kept


def _module_prefixes(names: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(n if n.endswith(".") else n + "." for n in (names or ()))


def _map(weights_mapper, key: str) -> str | None:
    return key if weights_mapper is None else weights_mapper.map_name(key)


def _maps_into(name: str | None, prefixes: tuple[str, ...]) -> bool:
    """`name` (a mapped prefix) lies inside or above one of the LM prefixes."""
    if not name:
        return False
    p = name if name.endswith(".") else name + "."
    return any(p.startswith(q) or q.startswith(p) for q in prefixes)


def resolve_mm_encoder_only_lm_prefixes(language_model_names: Iterable[str] | None, *,
                                        weights_mapper=None) -> tuple[str, ...] | None:
    """The language model's module prefixes ('language_model.', ...) from a
    model's _language_model_names, for dropping pure-LM shards under
    --mm-encoder-only. None (keep every shard) when there are none, or when
    one of them is also the checkpoint root of non-LM weights according to
    the mapper's orig_to_new_prefix (the filter would then drop encoder weights)."""
    prefixes = _module_prefixes(language_model_names)
    if not prefixes:
        return None
    mapping = getattr(weights_mapper, "orig_to_new_prefix", None) or {}
    non_lm_roots = [o if o.endswith(".") else o + "." for o, new in mapping.items() if not _maps_into(new, prefixes)]
    shared = tuple(p for p in prefixes if any(root.startswith(p) for root in non_lm_roots))
    if shared:
        _warning_once("mm-encoder-only whole-shard filter not applied: LM module prefix(es) %s share an HF "
                      "checkpoint root with non-LM weights (via WeightsMapper). Encoder-only load keeps the full "
                      "safetensors file list; finer HF prefixes or key-level filtering can enable skip later.",
                      shared)
        return None
    return prefixes


def _open_regular(path, mode: str = "rb"):
    """`path` opened only if it is a regular file (after symlinks): a FIFO,
    socket or device is an OSError naming it, never waited on (stat first, then
    a non-blocking open whose own fstat decides), as the engine opens files."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file: refusing to read it", os.fspath(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file: refusing to read it", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def filter_mm_encoder_only_safetensors_files(hf_weights_files: list[str], hf_folder: str, index_file: str,
                                             language_model_prefixes: Iterable[str], *,
                                             weights_mapper=None) -> list[str]:
    """Drops the shards whose every index entry maps (through
    `weights_mapper`, when given) under one of `language_model_prefixes`. A
    shard the index does not list is kept; without an index, or without
    prefixes, the list is returned unchanged."""
    prefixes = tuple(language_model_prefixes)
    if not prefixes:
        return hf_weights_files
    index_path = os.path.join(hf_folder, index_file)
    if not os.path.isfile(index_path):
        _warning_once("mm-encoder-only shard filter skipped: index file %s not found", index_path)
        return hf_weights_files
    with _open_regular(index_path, "r") as f:  # a repeated key is refused, as the engine refuses it
        weight_map: dict[str, str] = json.load(f, object_pairs_hook=refuse_duplicate_keys)["weight_map"]
    by_file: dict[str, list[str]] = {}
    for weight, file in weight_map.items():
        by_file.setdefault(file, []).append(weight)

    def lm_key(key: str) -> bool:
        mapped = _map(weights_mapper, key)
        return mapped is not None and mapped.startswith(prefixes)

    def lm_only(file: str) -> bool:
        keys = by_file.get(file)
        return bool(keys) and all(lm_key(k) for k in keys)

    kept = [p for p in hf_weights_files
            if not (lm_only(os.path.relpath(p, hf_folder)) or lm_only(os.path.basename(p)))]
    skipped = len(hf_weights_files) - len(kept)
    if skipped:
        _info_once("mm-encoder-only: skipped %d/%d safetensors shard(s) that only contain language-model "
                   "weights (prefixes=%s)", skipped, len(hf_weights_files), prefixes)
    return kept


def _hf_hub_cache() -> str:
    try:
        import huggingface_hub.constants

        return huggingface_hub.constants.HF_HUB_CACHE
    except ImportError:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        return os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")


def _local_snapshot_dirs(model_name_or_path: str, cache_dir: str | None) -> list[Path]:
    """Every snapshot folder of a repository in the Hub cache, found from the
    cache's layout alone (a cache seeded at a pinned commit has no refs/main)."""
    snapshots = Path(cache_dir or _hf_hub_cache()) / f"models--{model_name_or_path.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return []
    return [p for p in snapshots.iterdir() if p.is_dir()]


def drop_checkpoint_cache(model_name_or_path: str, revision: str | None = None,
                          cache_dir: str | None = None) -> None:
    """Asks the kernel to drop the page-cache pages of the model's
    *.safetensors files (posix_fadvise DONTNEED), on Linux only: a local
    folder, or a Hub repository already in the cache (the revision's
    snapshot, else every snapshot the cache holds for it; nothing is
    downloaded). A model not found locally is only logged; a file that
    cannot be advised is a warning; each folder logs the bytes released."""
    if sys.platform != "linux":
        return
    folders: list[Path] = []
    if os.path.isdir(model_name_or_path):
        folders = [Path(model_name_or_path)]
    else:
        with contextlib.suppress(OSError, ValueError):
            folders = [Path(_engine.cached_snapshot(model_name_or_path, ["*.safetensors"], revision, cache_dir))]
        if not folders:
            folders = _local_snapshot_dirs(model_name_or_path, os.fspath(cache_dir) if cache_dir else None)
    if not folders:
        _info_once("No local checkpoint found for %s; skipping page-cache eviction", model_name_or_path)
        return
    for folder in folders:
        released = 0
        for path in folder.glob("*.safetensors"):
            try:
                with _open_regular(path) as f:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as e:
                logger.warning("Could not release checkpoint page cache for %s: %s", path, e)
            else:
                released += path.stat().st_size
        logger.info("Released %.2f GiB of checkpoint page cache in %s", released / 1024**3, folder)

# ---- finalize_model_weights (vLLM 0.34) ---------------------------------------------------------------------


def _vllm_finalize_helpers():
    """(is a quantization method, is a deferred attention layer, the device
    context): vLLM's own where vLLM is importable, else their plain forms."""
    try:
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        from vllm.model_executor.model_loader.utils import device_loading_context

        return (lambda o: isinstance(o, QuantizeMethodBase)), is_deferred_attention_layer, device_loading_context
    except ImportError:
        def is_quant_method(o) -> bool:
            return (o is not None and not isinstance(o, torch.nn.Module)
                    and callable(getattr(o, "process_weights_after_loading", None)))

        return is_quant_method, (lambda m: False), _on_device


@contextlib.contextmanager
def _on_device(module: torch.nn.Module, device: torch.device | None):
    """The module's host parameters on `device` for the block, back after."""
    if device is None or torch.device(device).type == "cpu":
        yield module
        return
    moved = {n for n, p in module.named_parameters() if p.device.type == "cpu"}
    for n, p in module.named_parameters():
        if n in moved:
            p.data = p.data.to(device)
    try:
        yield module
    finally:
        for n, p in module.named_parameters():
            if n in moved:
                p.data = p.data.to("cpu")


def finalize_model_weights(model: torch.nn.Module, target_device: torch.device | None = None) -> None:
    """Runs every module's own process_weights_after_loading() once, each
    after all of its submodules (a module shared by several parents before
    all of them), as a full load or reload ends in vLLM 0.34. Quantization
    methods, and the submodules of a module that has one, are skipped (their
    method processes them). Only attention layers' hooks run with their
    offloaded parameters on `target_device`."""
    is_quant_method, is_deferred_attention, device_context = _vllm_finalize_helpers()
    seen: set[torch.nn.Module] = set()

    def children_first(module: torch.nn.Module):
        quantized = is_quant_method(getattr(module, "quant_method", None))
        for child in [] if quantized else module.children():
            if child not in seen:
                seen.add(child)
                yield from children_first(child)
        yield module

    for module in children_first(model):
        if is_quant_method(module):
            continue
        hook = getattr(module, "process_weights_after_loading", None)
        if callable(hook):
            with device_context(module, target_device if is_deferred_attention(module) else None):
                hook()
