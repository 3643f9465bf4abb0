"""The machine's limits, measured in the same run as the loads they bound
(bench/vllm/run.py): memory copy bandwidth (one thread and every CPU; into
pages already touched, and into fresh pages, whose first touch costs a page
fault and the kernel's zeroing: 4 KiB pages, and 2 MiB transparent huge
pages where the kernel has them) and O_DIRECT read bandwidth of the model's
files (their page cache dropped first; the disk, not the cache).

    python bench/vllm/machine.py [FILES_OR_DIRS...]   prints one JSON object

Pure Python: the copies are libc memmove through ctypes (which releases the
GIL, so the threads copy in parallel), the reads os.preadv into aligned
anonymous mappings.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import pathlib
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "python"))
from pagecache import drop_cache  # noqa: E402  (the tests' cold runs drop pages the same way)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.memmove.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memmove.restype = ctypes.c_void_p
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE = 14
HUGE = 2 << 20


def _addr(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def _anon(n: int) -> mmap.mmap:
    """Private anonymous memory, as malloc's (a shared one is shmem: no THP)."""
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _fresh(n: int, huge: bool) -> mmap.mmap:
    m = _anon(n)
    if huge:
        _libc.madvise(_addr(m), n, MADV_HUGEPAGE)
    return m


def _copy(dst: int, src: int, n: int, threads: int) -> float:
    """Seconds to copy n bytes from src to dst, split over `threads` threads."""
    step = (n // threads + HUGE - 1) // HUGE * HUGE
    parts = [(i, min(step, n - i)) for i in range(0, n, step)]
    ts = [threading.Thread(target=_libc.memmove, args=(dst + i, src + i, k)) for i, k in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def memcpy_bandwidth(size: int = 512 << 20, repeats: int = 3) -> dict:
    """GB/s of memmove: {touched_1t, fresh_1t, fresh_huge_1t, touched_all, fresh_all, fresh_huge_all} (medians)."""
    cpus = len(os.sched_getaffinity(0))
    src = _anon(size)
    src.write(os.urandom(1 << 20) * (size >> 20))
    s = _addr(src)
    out: dict[str, list[float]] = {}
    for _ in range(repeats):
        for key, threads, fresh, huge in (("fresh_1t", 1, True, False), ("fresh_huge_1t", 1, True, True),
                                           ("touched_1t", 1, False, False), ("fresh_all", cpus, True, False),
                                           ("fresh_huge_all", cpus, True, True),
                                           ("touched_all", cpus, False, False)):
            dst = _fresh(size, huge)
            d = _addr(dst)
            if not fresh:
                _copy(d, s, size, threads)  # first touch, untimed
            out.setdefault(key, []).append(size / _copy(d, s, size, threads) / 1e9)
            dst.close()
    src.close()
    res = {k: round(statistics.median(v), 2) for k, v in out.items()}
    res["cpus"] = cpus
    return res


def files_under(paths):
    """The regular files of `paths` (files, or folders walked), in name order."""
    for p in paths:
        p = pathlib.Path(p)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            yield p


def drop(paths) -> None:
    """Every page of the files of `paths` written back and dropped (pagecache.drop_cache)."""
    drop_cache(files_under(paths))


def odirect_bandwidth(paths, threads: int = 4, block: int = 8 << 20) -> dict:
    """GB/s reading the files with O_DIRECT (page cache dropped first), `threads` readers of `block` bytes."""
    files = [p for p in files_under(paths) if p.stat().st_size > 0]
    drop(files)
    jobs = []
    for p in files:
        size = p.stat().st_size
        jobs += [(p, off, min(block, size - off)) for off in range(0, size, block)]
    lock = threading.Lock()
    total = [0]
    it = iter(jobs)

    def reader():
        buf = _anon(block)
        fds = {}
        try:
            while True:
                with lock:
                    job = next(it, None)
                if job is None:
                    return
                p, off, n = job
                fd = fds.get(p)
                if fd is None:
                    fd = fds[p] = os.open(p, os.O_RDONLY | os.O_DIRECT)
                aligned = (n + 4095) // 4096 * 4096
                got = os.preadv(fd, [memoryview(buf)[:aligned]], off)
                with lock:
                    total[0] += min(got, n)
        finally:
            for fd in fds.values():
                os.close(fd)
            buf.close()

    ts = [threading.Thread(target=reader) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    sec = time.perf_counter() - t0
    return {"gbps": round(total[0] / sec / 1e9, 2), "bytes": total[0], "seconds": round(sec, 3), "threads": threads}


def measure(paths) -> dict:
    out = {"memcpy_gbps": memcpy_bandwidth()}
    if paths:
        out["odirect"] = odirect_bandwidth(paths)
    return out


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1:]), indent=1))
