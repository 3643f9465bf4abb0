"""The Hugging Face Hub and ModelScope: the reference's helpers, and loading
a repository's weights while they download.

    from weightlift import hub_weights_iterator
    for name, tensor in hub_weights_iterator("org/model"):   # one pass: download + load
        ...

    folder = download_weights_from_hf("org/model", None, ["*.safetensors"], load_while_downloading=True)
    for name, tensor in stream_weights(folder, "stream"):  # the files are readable while they arrive
        ...

The files of such a folder are served through the engine's Env (a path
overlay on the snapshot folder), so every iterator that reads through the
engine sees them at once; plain os/open calls see each file only once its
blob is verified and linked.

Everything runs in the C++ engine (include/weightlift/hub.h: HubSource, the
downloads: libcurl, parallel ranged requests for large files, into the very
cache huggingface_hub uses); this module is the Python face. huggingface_hub
itself is optional: when it is installed its HF_HUB_OFFLINE constant is
honoured (as the reference does) and an offline miss raises its
LocalEntryNotFoundError. A blob whose bytes do not match the hash the Hub
vouches for (docs/integrity.md) fails the load (CorruptDataError naming the
repository, the file and the revision) even when tensors were already handed
over.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Generator

import torch

from . import _core
from ._engine import iterate
from ._files import get_lock
from ._log import logger as package_logger

logger = logging.getLogger(__name__)


def hf_offline() -> bool | None:
    """huggingface_hub's HF_HUB_OFFLINE when it is installed (the reference reads it there), else None:
    the engine reads $HF_HUB_OFFLINE itself."""
    try:
        import huggingface_hub.constants as c
    except ImportError:
        return None
    return bool(c.HF_HUB_OFFLINE)


def _log(lines) -> None:
    for line in lines:
        if line.startswith("warning: "):
            logger.warning("%s", line[len("warning: "):])
        else:
            logger.info("%s", line)


def enable_xet_high_performance() -> None:
    """The reference's switch: huggingface_hub's Xet high-performance mode, unless
    HF_XET_HIGH_PERFORMANCE is set in the environment (then the user decides)."""
    if "HF_XET_HIGH_PERFORMANCE" in os.environ:
        return
    try:
        import huggingface_hub.constants
    except ImportError:
        return  # nothing to switch on: weightlift's own downloads do not use Xet
    huggingface_hub.constants.HF_XET_HIGH_PERFORMANCE = True


def _use_modelscope() -> bool:
    return os.environ.get("VLLM_USE_MODELSCOPE", "").strip().lower() in ("1", "true", "yes", "on")


def maybe_download_from_modelscope(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    ignore_patterns: str | list[str] | None = None,
    allow_patterns: list[str] | str | None = None,
) -> str | None:
    """With VLLM_USE_MODELSCOPE set, downloads `model` from ModelScope (under the
    model's lock, get_lock) into the layout modelscope's own client reads offline,
    and returns its folder; an existing local path is returned as is. Without
    VLLM_USE_MODELSCOPE: None."""
    if not _use_modelscope():
        return None
    as_list = lambda p: [p] if isinstance(p, str) else list(p or [])  # noqa: E731
    with get_lock(model, download_dir):
        if os.path.exists(model):
            return model
        folder, lines = _core.modelscope_snapshot_download(
            model, revision or "master", os.fspath(download_dir) if download_dir else "", as_list(allow_patterns),
            as_list(ignore_patterns), hf_offline())
    _log(lines)
    return folder


# Sources of download_weights_from_hf(load_while_downloading=True): alive until
# their blobs are final (a background thread waits for them), so the folder's
# weights stay readable through the engine while they arrive.
_sources: dict[tuple[str, str, str], _core.HubSource] = {}
_sources_lock = threading.Lock()


def _keep_until_final(key, source) -> None:
    def wait():
        try:
            source.finish()
        except Exception as e:  # the loads that read the files report it themselves
            logger.warning("%s", e)
        finally:
            _log(source.logs())

    # Not a daemon: a process that ends while the blobs arrive waits for them at exit (as for any
    # non-daemon thread) instead of tearing the interpreter down under a thread that is inside the
    # engine, which ends the process with std::terminate when that thread comes back for the GIL.
    threading.Thread(target=wait, name="weightlift-hub-" + key[0], daemon=False).start()


def hub_source(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> _core.HubSource:
    """Starts loading-while-downloading `repo_id` (HubSource in hub.h): returns at
    once with .folder, .weight_files and .pending; while the source lives, the
    weight files are readable through every weightlift loader as they arrive;
    .finish() blocks until every blob is verified and linked (raises otherwise)."""
    source = _core.HubSource(repo_id, revision or "main", os.fspath(cache_dir) if cache_dir else "", hf_offline())
    _log(source.logs())
    return source


def hub_weights_iterator(
    repo_id: str,
    revision: str | None = None,
    cache_dir: str | None = None,
    *,
    strategy: str | None = None,
    max_queued_bytes: int = 1 << 30,
    **engine,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """(name, tensor) for every weight of a Hub repository, loaded while it
    downloads: ranged parallel GETs fill the cache and the tensors in one pass,
    each tensor yielded once its bytes arrived. The cache ends exactly as a
    plain download leaves it. Raises at the end (CorruptDataError naming the
    file) when a blob does not match its ETag, even after its tensors were
    yielded. strategy None (the engine's auto, which reads files still
    arriving as views): each tensor is a copy-on-write view of the cache file
    it arrived in (no second copy); "stream" reads into new memory. `engine`:
    the loader's options (threads, block_size, max_memory...)."""
    source = hub_source(repo_id, revision, cache_dir)
    engine.setdefault("file_views", True)  # as every iterator of the package
    yield from iterate(source.weight_files, max_queued_bytes=max_queued_bytes, ordered=False,
                       strategy=strategy or "auto", **engine)
    source.finish()
    _log(source.logs())


def streaming_snapshot_folder(model_name_or_path: str, cache_dir: str | None, revision: str | None) -> str:
    """download_weights_from_hf(..., load_while_downloading=True): the
    snapshot folder at once, its weights downloading in the background and
    readable by the safetensors iterators as they arrive (a load through the
    engine fails at its end if a blob does not verify). The repository's own
    choice of weights is used (as `weightlift load REPO` picks them: index,
    else *.safetensors, *.bin, *.pt)."""
    key = (model_name_or_path, revision or "main", os.fspath(cache_dir) if cache_dir else "")
    with _sources_lock:
        source = _sources.get(key)
        if source is None:
            source = hub_source(model_name_or_path, revision, cache_dir)
            if source.pending:
                _sources[key] = source
                _keep_until_final(key, source)
    return source.folder


# ---- the reference's downloads ---------------------------------------------------------------------------------


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
        package_logger.info("%s", line)


def download_weights_from_hf(
    model_name_or_path: str,
    cache_dir: str | None,
    allow_patterns: list[str],
    revision: str | None = None,
    subfolder: str | None = None,
    ignore_patterns: str | list[str] | None = None,
    *,
    load_while_downloading: bool = False,
) -> str:
    """Downloads a model's weight files into the Hub cache and returns the
    snapshot folder. With "*.safetensors" allowed and an index in the repo,
    exactly the files its weight_map names are fetched; otherwise the first
    allowed pattern that matches a file of the repo. Offline, only the cache
    is used (LocalEntryNotFoundError when the files are not there). Holds the
    model's lock (get_lock) while downloading.

    load_while_downloading=True (ours; not with subfolder, ignore_patterns or
    ModelScope): returns the folder at once while the weights download in the
    background (streaming_snapshot_folder)."""
    if load_while_downloading and not (subfolder or ignore_patterns or _use_modelscope()):
        return streaming_snapshot_folder(model_name_or_path, cache_dir, revision)
    assert len(allow_patterns) > 0
    if isinstance(ignore_patterns, str):
        ignore_patterns = [ignore_patterns]
    offline = hf_offline()
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
        package_logger.info("Time spent downloading weights for %s: %.6f seconds", model_name_or_path, took)
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
        hf_offline(), subfolder or "")
    _log_lines(lines)
