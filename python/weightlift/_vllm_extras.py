"""Names vLLM 0.32's weight_utils has beyond the reference, with the same
arguments and behaviour:

    filter_safetensors_files_by_weight_name   drop shards holding only weights the model does not load
    resolve_mm_encoder_only_lm_prefixes       --mm-encoder-only: the language model's module prefixes
    filter_mm_encoder_only_safetensors_files  --mm-encoder-only: drop shards holding only LM weights
    drop_checkpoint_cache                     evict a model's safetensors files from the page cache
    DisabledTqdm                              a tqdm that never draws

Headers are read by the engine (no safetensors package needed); the index is
plain JSON. A leaf: it imports only the ground floor (_core, _log).
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tqdm.auto import tqdm

from . import _core
from ._log import log_once, logger


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
        names = [n for n, _, _ in _core.list_tensors([os.fspath(f)])]
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
    with open(index_path) as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
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


def drop_checkpoint_cache(model_name_or_path: str, revision: str | None = None,
                          cache_dir: str | None = None) -> None:
    """Asks the kernel to drop the page-cache pages of the model's
    *.safetensors files (posix_fadvise DONTNEED): a local folder, or a Hub
    repository's snapshot already in the cache (nothing is downloaded). A
    model not found locally is only logged; a file that cannot be advised
    is a warning."""
    folder: Path | None = None
    if os.path.isdir(model_name_or_path):
        folder = Path(model_name_or_path)
    else:
        try:
            found, _ = _core.download_weights_from_hf(model_name_or_path, ["*.safetensors"], revision or "main", [],
                                                      os.fspath(cache_dir) if cache_dir else "", True, "")
            folder = Path(found)
        except (OSError, ValueError):
            folder = None
    if folder is None:
        _info_once("No local checkpoint found for %s; skipping page-cache eviction", model_name_or_path)
        return
    for path in folder.glob("*.safetensors"):
        try:
            with path.open("rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            logger.warning("Could not release checkpoint page cache for %s: %s", path, e)
