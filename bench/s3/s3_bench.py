#!/usr/bin/env python3
"""Object-storage benchmark: one loopback SeaweedFS (signatures checked), one
synthesized checkpoint, every reader side by side in the same run.

  .venv/bin/python bench/s3/s3_bench.py [--size 2GB] [--shards 4] [--runs 3] [--skip NAME ...]

Readers, each in its own process. Time: the read itself (the CLI's engine time;
for Python readers from after their imports, which cost torch's ~2-3 s and ~0.5 GiB
here; curl's whole run). Peak RSS: the process's, from wait4, and for Python
readers also beyond what the imports took. Every reader's byte count is checked.
The best of --runs rounds is reported; a round runs every reader once.
  weightlift-cli     weightlift load s3://.../ (auto -> stream; keeps every tensor, so RSS includes the output)
  weightlift-py      runai_safetensors_weights_iterator over the same URLs (tensors dropped as consumed)
  runai-streamer     runai-model-streamer + runai-model-streamer-s3, SafetensorsStreamer as the
                     reference drives it (stream_files, get_tensors, clone)
  boto3+safetensors  boto3 download_file of every shard (multipart, 16 threads) then safetensors.torch.load_file
  limit              the server's own limit: curl fetching every byte in 8 MiB ranges, 16 in parallel, into /dev/null
  local-page-cache   calibration, not a peer: weightlift load of the local copy (stream, from the page cache) into
                     the same amount of fresh memory; on this VM first-touching ~2 GB of new pages can cost seconds
                     (kernel page zeroing: clear_page_erms in perf), which the CLI pays and curl into /dev/null does not

Bench-only packages: bench/s3/requirements.txt (installed by this script into
the project's .venv unless --no-install). Numbers are noisy: the machine is
shared and its 2 cores serve and receive at once.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "s3"))
from s3servers import SeaweedServer  # noqa: E402

CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))
BUCKET = "bench"
PREFIX = "model/"
CHUNK = 8 << 20
CONNECTIONS = 16


def run_measured(argv, env, cwd=None):
    """(seconds, peak RSS bytes, stdout, stderr) of a child process."""
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=cwd)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    so, se = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({p.returncode}):\n{se[-3000:]}")
    return dt, ru.ru_maxrss * 1024, so, se


# Each Python reader prints "<tensor bytes> <seconds after imports> <RSS KiB after imports>".
PY_WEIGHTLIFT = r"""
import resource, sys, time, weightlift
base, t0, n = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic(), 0
for name, t in weightlift.runai_safetensors_weights_iterator(sys.argv[1:], use_tqdm_on_load=False):
    n += t.numel() * t.element_size()
print(n, time.monotonic() - t0, base)
"""

PY_RUNAI = r"""
import resource, sys, time
from runai_model_streamer import SafetensorsStreamer
base, t0, n = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic(), 0
with SafetensorsStreamer() as streamer:
    streamer.stream_files(sys.argv[1:])
    for name, t in streamer.get_tensors():
        t = t.clone()  # the reference clones out of the streamer's reused buffer
        n += t.numel() * t.element_size()
print(n, time.monotonic() - t0, base)
"""

PY_BOTO3 = r"""
import os, resource, sys, tempfile, time, boto3
from boto3.s3.transfer import TransferConfig
from safetensors.torch import load_file
base, t0, n = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic(), 0
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=16)
with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
    for url in sys.argv[1:]:
        bucket, key = url[5:].split("/", 1)
        local = os.path.join(d, os.path.basename(key))
        s3.download_file(bucket, key, local, Config=cfg)
        for t in load_file(local).values():
            n += t.numel() * t.element_size()
        os.remove(local)
print(n, time.monotonic() - t0, base)
"""


def limit_cmd(server, sizes, workdir):
    """curl fetching every byte of every object in CHUNK ranges, CONNECTIONS at once, into /dev/null.
    One operation per range ("next" resets per-URL options such as range; curl would otherwise
    apply the last range to every URL); each prints its status and size for the check."""
    cfg = os.path.join(workdir, "ranges.curl")
    with open(cfg, "w") as f:
        first = True
        for key, size in sizes.items():
            for off in range(0, size, CHUNK):
                if not first:
                    f.write("next\n")
                first = False
                f.write(f'url = "{server.endpoint}/{BUCKET}/{key}"\n'
                        f'range = "{off}-{min(off + CHUNK, size) - 1}"\noutput = "/dev/null"\n'
                        f'aws-sigv4 = "aws:amz:us-east-1:s3"\nuser = "{server.access_key}:{server.secret_key}"\n'
                        'header = "x-amz-content-sha256: '
                        'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"\n'
                        'fail\nsilent\nshow-error\nwrite-out = "%{http_code} %{size_download}\\n"\n')
    return ["curl", "--parallel", "--parallel-max", str(CONNECTIONS), "-K", cfg]


def check_limit_output(stdout, total):
    got = sum(int(line.split()[1]) for line in stdout.splitlines() if line.strip())
    if got != total:
        raise RuntimeError(f"curl fetched {got} bytes, not {total}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GB", help="checkpoint size for `weightlift synth` (default 2GB)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (every reader once each); the best is reported")
    ap.add_argument("--skip", nargs="*", default=[], help="readers to leave out")
    ap.add_argument("--no-install", action="store_true", help="do not pip-install bench/s3/requirements.txt")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if not a.no_install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", os.path.join(HERE, "requirements.txt")],
                       check=True)
    work = tempfile.mkdtemp(prefix="wl-s3bench-")
    server = None
    try:
        model = os.path.join(work, "model")
        subprocess.run([CLI, "synth", model, "--size", a.size, "--shards", str(a.shards)], check=True)
        server = SeaweedServer(data_dir=work)
        c = server.client()
        c.create_bucket(Bucket=BUCKET)
        from boto3.s3.transfer import TransferConfig

        up = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
        sizes = {}
        for name in sorted(os.listdir(model)):
            path = os.path.join(model, name)
            c.upload_file(path, BUCKET, PREFIX + name, Config=up)
            sizes[PREFIX + name] = os.path.getsize(path)
        shards = sorted(n for n in sizes if n.endswith(".safetensors"))
        urls = [f"s3://{BUCKET}/{k}" for k in shards]
        total = sum(sizes[k] for k in shards)
        total_tensor_bytes = int(subprocess.run([CLI, "load", model, "--no-progress"], capture_output=True,
                                                text=True, check=True).stderr.split("tensors, ")[1].split()[0])
        env = dict(os.environ, **server.env(), RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                   AWS_EC2_METADATA_DISABLED="true", BENCH_TMP=work)
        readers = {
            "weightlift-cli": [CLI, "load", f"s3://{BUCKET}/{PREFIX}", "--no-progress"],
            "weightlift-py": [sys.executable, "-c", PY_WEIGHTLIFT, *urls],
            "runai-streamer": [sys.executable, "-c", PY_RUNAI, *urls],
            "boto3+safetensors": [sys.executable, "-c", PY_BOTO3, *urls],
            "limit": limit_cmd(server, {k: sizes[k] for k in shards}, work),
            "local-page-cache": [CLI, "load", model, "--strategy", "stream", "--direct", "off", "--no-progress"],
        }
        results = {}
        best = {}
        # Rounds: every reader once per round, so that load on the shared machine spreads evenly.
        for _ in range(a.runs):
            for name, argv in readers.items():
                if name in a.skip or best.get(name, 0) is None:
                    continue
                try:
                    wall, rss, so, se = run_measured(argv, env)
                    base = 0
                    if name == "limit":
                        check_limit_output(so, total)
                        got, dt = total_tensor_bytes, wall
                    elif name in ("weightlift-cli", "local-page-cache"):  # the engine's own time, as the CLI reports it
                        m = re.search(r"tensors, (\d+) bytes from \d+ files in ([0-9.]+) s", se)
                        got, dt = int(m.group(1)), float(m.group(2))
                    else:
                        got, dt, base = so.split()[-3:]
                        got, dt, base = int(got), float(dt), int(base) * 1024
                    if got != total_tensor_bytes:
                        raise RuntimeError(f"read {got} tensor bytes, not {total_tensor_bytes}")
                except (RuntimeError, ValueError, AttributeError) as e:
                    print(f"{name}: {e}", file=sys.stderr)
                    best[name] = None
                    continue
                print(f"  {name:18s} {dt:7.2f} s  {total / dt / 1e9:6.2f} GB/s  peak RSS {rss / 2**20:7.0f} MiB"
                      f" ({(rss - base) / 2**20:.0f} MiB beyond imports)  process {wall:.2f} s", file=sys.stderr)
                if name not in best or dt < best[name][0]:
                    best[name] = (dt, rss, base, wall)
        for name in readers:
            if best.get(name):
                dt, rss, base, wall = best[name]
                results[name] = {"seconds": dt, "gbps": total / dt / 1e9, "peak_rss_mib": rss / 2**20,
                                 "rss_beyond_imports_mib": (rss - base) / 2**20, "process_seconds": wall}
        print_table(results, total)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"bytes": total, "results": results}, f, indent=2)
    finally:
        if server:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def print_table(results, total):
    lim = results.get("limit", {}).get("gbps")
    runai = results.get("runai-streamer", {}).get("gbps")
    print(f"checkpoint: {total / 1e9:.2f} GB over loopback SeaweedFS\n")
    print("| reader | GB/s | vs Run:ai streamer | vs server limit | peak RSS (MiB) | RSS beyond imports (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        vr = f"{r['gbps'] / runai:.2f}x" if runai else "-"
        vl = f"{r['gbps'] / lim:.0%}" if lim else "-"
        rss, beyond = r["peak_rss_mib"], r["rss_beyond_imports_mib"]
        print(f"| {name} | {r['gbps']:.2f} | {vr} | {vl} | {rss:.0f} | {beyond:.0f} |")


if __name__ == "__main__":
    main()
