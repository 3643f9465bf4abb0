#!/usr/bin/env python3
"""What verifying costs (docs/integrity.md): a cold `weightlift load REPO` (one pass:
ranged parallel downloads, every blob hashed in order as its chunks arrive, tensors
handed over as they land) and a plain `weightlift download REPO`, from the loopback
Hub server of the tests, with the server vouching for every blob's SHA-256 (the
verifying path) and with the same server vouching for no hash (the unverified
path: ETags of 32 hex, no lfs.oid), alternating, same run.

  .venv/bin/python bench/integrity/integrity_bench.py [--size 512MB] [--shards 2] [--runs 3]

The server's files stay in the page cache ("hot": the source is as fast as
loopback and Python allow, so hashing is as exposed as it gets); each run starts
from an empty cache. Prints medians of wall time and peak RSS (GNU time) and the
verifying / unverified ratio. Noisy on a shared machine: read the ratios.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "hubserver"))
from hubserver import HubServer  # noqa: E402

CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))


def timed(cmd, env):
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M %U %S"] + cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    wall, kb, user, sys_ = r.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kb) / 1024.0, float(user) + float(sys_), r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="512MB")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wl-integrity-bench-")
    srv = None
    try:
        repo = os.path.join(work, "repos", "bench", "model", "main")
        subprocess.run([CLI, "synth", repo, "--size", args.size, "--shards", str(args.shards)], check=True,
                       capture_output=True)
        total = sum(os.path.getsize(os.path.join(repo, f)) for f in os.listdir(repo))
        for f in os.listdir(repo):  # the server's side hot
            with open(os.path.join(repo, f), "rb") as fh:
                while fh.read(16 << 20):
                    pass
        srv = HubServer(os.path.join(work, "repos")).start()
        env = dict(os.environ, HF_ENDPOINT=srv.endpoint)
        env.pop("HF_TOKEN", None)
        commands = {"load": lambda: [CLI, "load", "bench/model", "--no-progress", "--verbose"],
                    "download": lambda: [CLI, "download", "bench/model", "-q"]}
        results = {}
        for _ in range(args.runs):
            for what, cmd in commands.items():
                for vouch in (True, False):
                    srv.state.vouch = vouch
                    cache = os.path.join(work, "cache")
                    shutil.rmtree(cache, ignore_errors=True)
                    wall, rss, cpu, err = timed(cmd(), dict(env, HF_HUB_CACHE=cache))
                    assert ("NOT verified" in err) == (not vouch), err[-2000:]
                    results.setdefault((what, vouch), []).append((wall, rss, cpu))
        print("repo: %.0f MiB in %d shards (weightlift synth), loopback Hub server, server side hot; medians of %d"
              % (total / 2**20, args.shards, args.runs))
        print("%-9s %-22s %8s %8s %8s %13s" % ("command", "server vouches", "time s", "MB/s", "CPU s", "peak RSS MiB"))
        for what in commands:
            rows, cpus = {}, {}
            for vouch in (True, False):
                runs = results[(what, vouch)]
                rows[vouch] = statistics.median(w for w, _, _ in runs)
                cpus[vouch] = statistics.median(c for _, _, c in runs)
                label = "SHA-256 (verified)" if vouch else "nothing (unverified)"
                print("%-9s %-22s %8.2f %8.0f %8.2f %13.0f" % (what, label, rows[vouch], total / rows[vouch] / 1e6,
                                                              cpus[vouch], statistics.median(r for _, r, _ in runs)))
            print("%-9s verified / unverified: time %.3fx, CPU +%.2f s (%.2f CPU s per GB hashed)"
                  % (what, rows[True] / rows[False], cpus[True] - cpus[False],
                     (cpus[True] - cpus[False]) / (total / 1e9)))
    finally:
        if srv:
            srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
