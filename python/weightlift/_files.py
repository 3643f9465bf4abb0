"""Files around a load: the model lock, atomic writes, which weight files to
read (and in what order), and rewriting a PyTorch file as safetensors. The
rules are the engine's (model_lock_path, natural_key, the weight-file
filters, the converter); here the Python objects around them.

A leaf: imports only the bridge (_engine) and _log."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections import defaultdict
from collections.abc import Generator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

import filelock
import torch

from . import _engine
from ._log import logger

temp_dir = tempfile.gettempdir()


# ---- locks and atomic files ------------------------------------------------------


def model_lock_path(model_name_or_path: str | Path, cache_dir: str | None = None) -> str:
    """The engine's lock file of a model (the Hub client's, the NumPy cache's):
    under `cache_dir`, else the system's temporary folder."""
    return _engine.model_lock_path(str(model_name_or_path), cache_dir or temp_dir)


class SharedFileLock(filelock.UnixFileLock):
    """filelock's lock, taken as the engine takes its lock files (docs/integrity.md): never through a
    symbolic link and only on a regular file. filelock itself opens O_TRUNC following links and widens
    the mode to 0o666, so a link planted as the lock file in a shared folder would have the file it
    points to truncated and made world-writable; here that is a PermissionError naming the path."""

    def _acquire(self) -> None:
        path = self.lock_file
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, self._context.mode)
            created = True
        except FileExistsError:
            try:
                fd = os.open(path, flags)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise PermissionError(errno.EPERM, "the lock file is a symbolic link; refusing to use it "
                                                       "(in a shared folder another user may have planted it)",
                                          path) from None
                raise
            created = False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise PermissionError(errno.EPERM, "the lock file is not a regular file; refusing to use it", path)
        if created or st.st_uid == os.geteuid():  # another user's lock keeps its mode
            with suppress(PermissionError):
                os.fchmod(fd, self._context.mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
        else:
            self._context.lock_file_fd = fd


def get_lock(model_name_or_path: str | Path, cache_dir: str | None = None) -> filelock.BaseFileLock:
    """A file lock shared by every process (and user) working on this model:
    the engine's own model lock file (the Hub client's, the NumPy cache's),
    mode 0o666 so other users can take it; never taken through a link
    (SharedFileLock)."""
    lock_dir = cache_dir or temp_dir
    # The reference creates the parent of lock_dir (a quirk kept for identical behaviour).
    os.makedirs(os.path.dirname(lock_dir), exist_ok=True)
    return SharedFileLock(model_lock_path(model_name_or_path, lock_dir), mode=0o666)


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


def weight_files(path_or_files) -> list[str]:
    """A model folder's (or a file's) weight files as the engine finds them,
    or a list of paths as given."""
    if isinstance(path_or_files, (str, os.PathLike)):
        return list(_engine.find_weight_files(path_or_files)[0])
    return [os.fspath(f) for f in path_or_files]


def natural_sort(files) -> list[str]:
    """Paths in the engine's natural order (model-2 before model-10)."""
    return _engine.natural_sort(files)


def natural_sort_key(filepath: str) -> list:
    """model-00001-of-00005.safetensors -> ['model-', 1, '-of-', 5, '.safetensors']
    (the engine's natural order, weight_files.h natural_key)."""
    return [int(s) if s.isdigit() else s for s in _engine.natural_key(os.path.basename(filepath))]


def filter_duplicate_safetensors_files(hf_weights_files: list[str], hf_folder: str, index_file: str) -> list[str]:
    """Keeps only the files the folder's index names (drops e.g. a consolidated
    file next to shards). FileNotFoundError when the index names a missing file."""
    return _engine.filter_duplicate_safetensors_files(hf_weights_files, str(hf_folder), index_file)


def filter_files_not_needed_for_inference(hf_weights_files: list[str]) -> list[str]:
    """Drops training_args.bin, optimizer.bin/.pt, scheduler.pt and scaler.pt."""
    return _engine.filter_files_not_needed_for_inference(hf_weights_files)


# ---- conversion ------------------------------------------------------------------------------


def shared_pointers(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """Groups of names whose tensors share memory (the reference's _shared_pointers)."""
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
        _engine.convert_pytorch_to_safetensors(pt_filename, sf_filename)
    except (FileNotFoundError, PermissionError):
        raise
    except (ValueError, OSError, NotImplementedError) as e:
        raise RuntimeError(str(e)) from e
