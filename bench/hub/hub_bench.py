#!/usr/bin/env python3
"""Hub download benchmark: weightlift vs huggingface_hub.snapshot_download (and
hf_transfer when installed) from the same loopback Hub server, each connection
throttled to model a real link.

  .venv/bin/python bench/hub/hub_bench.py [--size-mb 1024] [--shards 2] [--rate-mbps 50] [--runs 1]

Each tool runs in its own process into its own empty cache; wall time and the
process's peak RSS (ru_maxrss of the child) are reported, with the ratio of
huggingface_hub's time to ours. The ceiling is also printed: what the server
can push over loopback with no throttle, single connection.
Numbers are noisy: the machine is shared and has 2 cores that serve and receive.
"""
import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "hubserver"))
from hubserver import HubServer  # noqa: E402

CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))


def make_repo(root, size_mb, shards):
    per = size_mb * (1 << 20) // shards
    d = os.path.join(root, "bench", "model", "main")
    os.makedirs(d, exist_ok=True)
    block = os.urandom(1 << 20)
    for i in range(shards):
        with open(os.path.join(d, "model-%05d-of-%05d.safetensors" % (i + 1, shards)), "wb") as f:
            left = per
            n = 0
            while left:
                b = hashlib.sha256(b"%d-%d" % (i, n)).digest() + block[32:]
                b = b[:min(left, len(b))]
                f.write(b)
                left -= len(b)
                n += 1
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "bench"}')


def timed(cmd, env):
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if r.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return dt, rss, before


def peak_rss_of(cmd, env):
    # GNU time gives the peak RSS of exactly this child
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M"] + cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    wall, kb = r.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kb) / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--rate-mbps", type=float, default=50.0, help="MB/s per connection")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wl-hub-bench-")
    try:
        make_repo(os.path.join(work, "repos"), args.size_mb, args.shards)
        srv = HubServer(os.path.join(work, "repos")).start()
        env = dict(os.environ, HF_ENDPOINT=srv.endpoint, HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ETAG_TIMEOUT="60")
        env.pop("HF_TOKEN", None)
        total = args.size_mb * (1 << 20)
        tools = {
            "weightlift": lambda cache: [CLI, "download", "bench/model", "--cache-dir", cache, "-q",
                                          "--connections", str(args.connections)],
            "huggingface_hub": lambda cache: [
                sys.executable, "-c",
                "import huggingface_hub as h; h.snapshot_download('bench/model', cache_dir=%r)" % cache],
        }
        try:
            import hf_transfer  # noqa: F401
            tools["huggingface_hub+hf_transfer"] = tools["huggingface_hub"]
        except ImportError:
            pass
        # Ceiling: one unthrottled stream from this server to curl over loopback.
        srv.set_rate(0)
        url = srv.endpoint + "/bench/model/resolve/main/model-00001-of-%05d.safetensors" % args.shards
        try:
            r = subprocess.run(["curl", "-sL", "-o", "/dev/null", "-w", "%{speed_download}", url],
                               capture_output=True, text=True)
            ceiling = float(r.stdout or 0) / 1e6
        except FileNotFoundError:  # no curl binary: no ceiling figure
            ceiling = float("nan")
        srv.set_rate(int(args.rate_mbps * 1e6))
        results = {}
        for _run in range(args.runs):
            for name, cmd in tools.items():
                cache = os.path.join(work, "cache-" + name.replace("+", "_"))
                shutil.rmtree(cache, ignore_errors=True)
                e = dict(env)
                if name.endswith("hf_transfer"):
                    e["HF_HUB_ENABLE_HF_TRANSFER"] = "1"
                subprocess.run(["sync"])
                wall, rss = peak_rss_of(cmd(cache), e)
                results.setdefault(name, []).append((wall, rss))
                shutil.rmtree(cache, ignore_errors=True)
        srv.stop()
        print("repo: %d MiB in %d shards; server throttled to %.0f MB/s per connection; "
              "unthrottled single-stream loopback ceiling %.0f MB/s"
              % (args.size_mb, args.shards, args.rate_mbps, ceiling))
        best = {k: min(v) for k, v in results.items()}
        ours = best["weightlift"][0]
        print("%-30s %9s %10s %12s %s" % ("tool", "time s", "MB/s", "peak RSS MiB", "time / weightlift"))
        for name, (wall, rss) in best.items():
            print("%-30s %9.2f %10.1f %12.0f %.2fx" % (name, wall, total / wall / 1e6, rss, wall / ours))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
