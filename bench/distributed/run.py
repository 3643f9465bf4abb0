#!/usr/bin/env python3
"""Distributed loading benchmark: N ranks (mpirun --oversubscribe on this
host), cold cache, the reference's default (every rank loads every file
itself) against weightlift's read-once + exchange (`load --distributed`),
side by side in one run.

    bench/distributed/run.py [--size 1GB] [--ranks 2,4] [--runs 3] [--dir DIR] [--json OUT]

Both modes run the same engine (stream strategy), so the ratio isolates
reading once. Two I/O settings:
  O_DIRECT   every rank's reads reach storage, as on separate nodes (no
             page cache shared between ranks): the honest model of N machines
  buffered   one page cache shared by the ranks (N GPUs of one node): the
             first rank to touch a page reads it for all
Per cell: bytes read from storage summed over ranks (each process's
/proc/self/io read_bytes) as a multiple of the checkpoint, wall time of the
slowest rank as a multiple of the machine's limit (one process reading the
checkpoint once, cold, O_DIRECT, measured in the same run), and peak RSS per
rank (VmHWM). Runs are interleaved round-robin; medians are reported.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))
SUMMARY = re.compile(r"loaded (\d+) tensors, (\d+) bytes from \d+ files in ([\d.]+) s .*peak RSS ([\d.]+) MiB, "
                     r"read (\d+) bytes, .*storage read (\d+) bytes")


def drop_cache(files):
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    except OSError:
        pass
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def parse(err):
    m = SUMMARY.search(err)
    if not m:
        raise RuntimeError(f"no summary line in:\n{err}")
    return {"bytes": int(m.group(2)), "seconds": float(m.group(3)), "rss_mib": float(m.group(4)),
            "engine_read": int(m.group(5)), "storage": int(m.group(6))}


def run_single(model, files):
    drop_cache(files)
    r = subprocess.run([CLI, "load", model, "--strategy", "stream", "--direct", "on", "--no-progress"],
                       capture_output=True, text=True, check=True)
    return parse(r.stderr)


def run_ranks(model, files, np, distributed, direct, tmp):
    drop_cache(files)
    out = os.path.join(tmp, f"run{time.monotonic_ns()}")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(np), "--output-filename", out, CLI, "load", model,
           "--strategy", "stream", "--direct", "on" if direct else "off", "--no-progress"]
    if distributed:
        cmd.append("--distributed")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    ranks = [parse(open(os.path.join(out, "1", f"rank.{r}", "stderr")).read()) for r in range(np)]
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": wall, "ranks": ranks}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/wl-dist-bench")
    ap.add_argument("--json")
    a = ap.parse_args()
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not found (scripts/setup installs openmpi-bin)")
    model = os.path.join(a.dir, "model")
    if not os.path.isdir(model):
        os.makedirs(a.dir, exist_ok=True)
        subprocess.run([CLI, "synth", model, "--size", a.size, "--shards", "4"], check=True)
    files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    ckpt = sum(os.path.getsize(f) for f in files)
    ranks = [int(x) for x in a.ranks.split(",")]
    cells = [(np, direct, dist) for np in ranks for direct in (True, False) for dist in (False, True)]
    results = {c: [] for c in cells}
    limit = []
    for _ in range(a.runs):  # round-robin: every cell sees the same machine conditions
        limit.append(run_single(model, files))
        for c in cells:
            results[c].append(run_ranks(model, files, c[0], c[2], c[1], a.dir))

    limit_s = statistics.median(x["seconds"] for x in limit)
    load = os.getloadavg()[0]
    print(f"checkpoint {ckpt / 1e9:.2f} GB in {len(files)} files; limit: one process reads it once, cold, "
          f"O_DIRECT, in {limit_s:.2f} s ({ckpt / limit_s / 1e9:.2f} GB/s); {os.cpu_count()} cores, "
          f"load average {load:.1f}; medians of {a.runs} runs\n")
    print("| ranks | I/O | mode | storage read, all ranks | × checkpoint | slowest rank s | × limit "
          "| mpirun wall s | peak RSS per rank (MiB) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for (np, direct, dist) in cells:
        runs = results[(np, direct, dist)]
        storage = statistics.median(sum(r["storage"] for r in x["ranks"]) for x in runs)
        slow = statistics.median(max(r["seconds"] for r in x["ranks"]) for x in runs)
        wall = statistics.median(x["wall"] for x in runs)
        rss = statistics.median(max(r["rss_mib"] for r in x["ranks"]) for x in runs)
        mode = "read once + exchange (--distributed)" if dist else "each rank reads every file"
        io = "O_DIRECT (separate caches)" if direct else "buffered (shared cache)"
        print(f"| {np} | {io} | {mode} | {storage / 1e9:.2f} GB | {storage / ckpt:.2f} | {slow:.2f} | "
              f"{slow / limit_s:.2f} | {wall:.2f} | {rss:.0f} |")
        rows.append({"ranks": np, "direct": direct, "distributed": dist, "storage_bytes": storage,
                     "storage_x": storage / ckpt, "slowest_s": slow, "x_limit": slow / limit_s, "wall_s": wall,
                     "peak_rss_mib": rss})
    if a.json:
        json.dump({"checkpoint_bytes": ckpt, "limit_s": limit_s, "load_average": load, "rows": rows},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
