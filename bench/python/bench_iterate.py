#!/usr/bin/env python3
"""Iterating a checkpoint through Python: weightlift against the `safetensors`
package and torch.load, in one run.

Every method consumes each tensor the way a model loader does: its bytes are
copied once into a destination buffer (as weight_loader copies into a
parameter), so lazy (mmap) readers pay for their page faults. Each method runs
in its own process (peak RSS = that process's VmHWM), cold (the files' pages
dropped from the page cache with posix_fadvise(DONTNEED) first) and warm.
Each method runs --repeat times, interleaved, and the best run is kept (the
machine is shared, so single runs swing by up to 10x). Two limits are measured in the same run: reading the files with plain
readinto() (cold: the disk; warm: the page cache) and the C++ CLI
(`weightlift load`), the path the Python one should come close to.

    .venv/bin/python bench/python/bench_iterate.py --size 1GB [--dir /tmp/wl-bench-py]

The machine is shared (2 cores, other sessions building): numbers are noisy.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def drop_cache(files) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ---- the methods (each runs in a child process) -------------------------------------------------------


def _consume(it):
    import torch

    scratch = None
    n = 0
    count = 0
    for _, t in it:
        nbytes = t.numel() * t.element_size()
        if scratch is None or scratch.numel() < nbytes:
            scratch = torch.empty(max(nbytes, 64 << 20), dtype=torch.uint8)
        if nbytes:
            scratch[:nbytes].copy_(t.reshape(-1).view(torch.uint8))
        n += nbytes
        count += 1
    return n, count


def m_raw_read(st, pt):
    buf = bytearray(16 << 20)
    n = 0
    for p in st:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                n += k
    return n, 0


def m_wl_lazy(st, pt):
    import weightlift

    return _consume(weightlift.safetensors_weights_iterator(st, False))


def m_wl_eager(st, pt):
    import weightlift

    return _consume(weightlift.safetensors_weights_iterator(st, False, "eager"))


def m_wl_stream(st, pt):
    import weightlift

    return _consume(weightlift.stream_weights(st, "lazy", max_queued_bytes=256 << 20))


def m_wl_multithread(st, pt):
    import weightlift

    return _consume(weightlift.multi_thread_safetensors_weights_iterator(st, False, max_workers=2))


def m_st_safe_open(st, pt):
    from safetensors import safe_open

    def gen():
        for p in st:
            with safe_open(p, framework="pt") as f:
                for k in f.keys():
                    yield k, f.get_tensor(k)

    return _consume(gen())


def m_st_load_file(st, pt):
    from safetensors.torch import load_file

    def gen():
        for p in st:
            yield from load_file(p).items()

    return _consume(gen())


def m_torch_load(st, pt):
    import torch

    def gen():
        for p in pt:
            yield from torch.load(p, map_location="cpu", weights_only=True).items()

    return _consume(gen())


def m_wl_pt(st, pt):
    import weightlift

    return _consume(weightlift.pt_weights_iterator(pt, False))


METHODS = {
    "raw readinto (limit)": m_raw_read,
    "weightlift safetensors_weights_iterator (lazy)": m_wl_lazy,
    "weightlift safetensors_weights_iterator (eager)": m_wl_eager,
    "weightlift stream_weights (C++ thread)": m_wl_stream,
    "weightlift multi_thread_safetensors (2 workers)": m_wl_multithread,
    "safetensors safe_open + get_tensor": m_st_safe_open,
    "safetensors load_file": m_st_load_file,
    "torch.load (.bin)": m_torch_load,
    "weightlift pt_weights_iterator (.bin)": m_wl_pt,
}


def child(method: str, st, pt, cold: bool) -> None:
    # Imports first, so their memory is in the baseline and not in the timing.
    import torch  # noqa: F401
    import safetensors.torch  # noqa: F401
    import weightlift  # noqa: F401

    drop_cache(st + pt) if cold else None
    base = peak_rss()
    t0 = time.perf_counter()
    n, count = METHODS[method](st, pt)
    dt = time.perf_counter() - t0
    print(json.dumps({"bytes": n, "tensors": count, "seconds": dt, "peak_rss": peak_rss(), "base_rss": base}))


def run_child(method, st, pt, cold):
    out = subprocess.run([sys.executable, __file__, "--child", method, "--st", json.dumps(st), "--pt",
                          json.dumps(pt)] + (["--cold"] if cold else []),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_cli(cli, folder, files, cold, strategy="lazy"):
    if cold:
        drop_cache(files)
    t0 = time.perf_counter()
    out = subprocess.run([cli, "load", folder, "--strategy", strategy, "--no-progress"], check=True,
                         capture_output=True, text=True)
    dt = time.perf_counter() - t0
    m = re.search(r"loaded (\d+) tensors, (\d+) bytes .* in ([\d.]+) s .* peak RSS ([\d.]+) MiB", out.stderr)
    if not m:
        raise RuntimeError(f"unexpected output of {cli} load: {out.stderr!r}")
    return {"bytes": int(m.group(2)), "tensors": int(m.group(1)), "seconds": float(m.group(3)),
            "peak_rss": float(m.group(4)) * 2**20, "base_rss": 0, "wall": dt}


def prepare(folder: str, size: str, cli: str):
    if not glob.glob(os.path.join(folder, "*.safetensors")):
        subprocess.run([cli, "synth", folder, "--size", size, "--seed", "1"], check=True)
    st = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    pt_dir = os.path.join(folder, "pt")
    pt = sorted(glob.glob(os.path.join(pt_dir, "*.bin")))
    if len(pt) != len(st):
        import torch
        from safetensors.torch import load_file

        os.makedirs(pt_dir, exist_ok=True)
        for i, p in enumerate(st):
            torch.save(load_file(p), os.path.join(pt_dir, f"pytorch_model-{i + 1:05d}-of-{len(st):05d}.bin"))
        pt = sorted(glob.glob(os.path.join(pt_dir, "*.bin")))
    return st, pt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--dir", default="/tmp/wl-bench-py")
    ap.add_argument("--cli", default=os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift")))
    ap.add_argument("--methods", default="", help="comma-separated substrings of method names (default: all)")
    ap.add_argument("--warm-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per method (interleaved); the best is reported")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--child", default="")
    ap.add_argument("--st", default="[]")
    ap.add_argument("--pt", default="[]")
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.child, json.loads(a.st), json.loads(a.pt), a.cold)
        return

    folder = os.path.join(a.dir, a.size)
    st, pt = prepare(folder, a.size, a.cli)
    total = sum(os.path.getsize(p) for p in st)
    print(f"checkpoint: {len(st)} safetensors files, {total / 1e9:.2f} GB (and the same tensors as {len(pt)} .bin "
          f"files); torch {__import__('torch').__version__}; {os.cpu_count()} CPUs")
    wanted = [m for m in METHODS if not a.methods or any(s in m for s in a.methods.split(","))]
    rows = []
    for cache in (["warm"] if a.warm_only else ["cold", "warm"]):
        cold = cache == "cold"
        if not cold:  # fill the page cache
            m_raw_read(st, pt)
            m_raw_read(pt, [])
        results = {}
        for _ in range(a.repeat):  # interleaved, so a noisy moment hits every method alike
            runs = {}
            if os.path.exists(a.cli):
                runs["weightlift load (C++ CLI, lazy)"] = run_cli(a.cli, folder, st, cold)
                runs["weightlift load (C++ CLI, eager)"] = run_cli(a.cli, folder, st, cold, "eager")
            for m in wanted:
                runs[m] = run_child(m, st, pt, cold)
            for m, r in runs.items():
                if m not in results or r["seconds"] < results[m]["seconds"]:
                    results[m] = r
        limit = results.get("raw readinto (limit)")
        for m, r in results.items():
            gbs = r["bytes"] / r["seconds"] / 1e9
            rows.append({"cache": cache, "method": m, "GB/s": gbs, "seconds": r["seconds"],
                         "vs_limit": (r["seconds"] and limit and (limit["seconds"] / r["seconds"])) or None,
                         "peak_rss_MiB": r["peak_rss"] / 2**20,
                         "rss_growth_MiB": (r["peak_rss"] - r["base_rss"]) / 2**20})
    print()
    print(f"| cache | method | GB/s | x raw read | peak RSS (MiB) | RSS growth (MiB) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        vs = f"{r['vs_limit']:.2f}" if r["vs_limit"] else "-"
        print(f"| {r['cache']} | {r['method']} | {r['GB/s']:.2f} | {vs} | {r['peak_rss_MiB']:.0f} | "
              f"{r['rss_growth_MiB']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
