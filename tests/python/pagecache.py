"""Drops files' pages from the page cache (the tests' "cold" runs)."""
import os


def drop_cache(paths):
    """Writes back, then drops, every page of `paths` (fdatasync + POSIX_FADV_DONTNEED)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
