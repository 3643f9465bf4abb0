#!/usr/bin/env python3
"""From an empty cache to tensors in memory, side by side in one run, from the
same loopback Hub server throttled per connection (a real link's per-stream limit):

  weightlift load REPO              load while downloading (one pass)
  weightlift download REPO          the download alone (the target's yardstick)
  weightlift download + load        the two passes one after the other
  huggingface_hub 0.27 / 2.x        snapshot_download, then safetensors.torch.load_file of every shard
  huggingface_hub 0.27 + hf_transfer the same with HF_HUB_ENABLE_HF_TRANSFER=1 (when installed)

  .venv/bin/python bench/hub/hub_load_bench.py [--size-mb 512] [--shards 2] [--rate-mbps 50] [--runs 1]

Each tool runs in its own process into its own empty cache; wall time and the
process's peak RSS (GNU time) are reported, with ratios to weightlift's
download alone and to huggingface_hub's download + load. hf_xet does not apply:
the server speaks no Xet protocol (2.x falls back to plain HTTP, as measured).
Numbers are noisy: the machine is shared and its 2 cores both serve and receive.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "hubserver"))
from hubserver import HubServer  # noqa: E402

CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))
HF2 = os.path.join(ROOT, ".venv", "hf2")
TENSOR = 16 << 20  # bytes per tensor


def make_repo(root, size_mb, shards):
    """Valid safetensors shards of U8 tensors (16 MiB each) and an index."""
    d = os.path.join(root, "bench", "model", "main")
    os.makedirs(d, exist_ok=True)
    per = size_mb * (1 << 20) // shards // TENSOR
    block = os.urandom(1 << 20)
    weight_map = {}
    for s in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        header = {}
        for t in range(per):
            header["layers.%d.w%d" % (s, t)] = {"dtype": "U8", "shape": [TENSOR],
                                                "data_offsets": [t * TENSOR, (t + 1) * TENSOR]}
            weight_map["layers.%d.w%d" % (s, t)] = name
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for i in range(per * TENSOR >> 20):
                f.write(bytes([s, i & 255, (i >> 8) & 255]) + block[3:])
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "bench"}')
    return shards * per * TENSOR


def measure(cmd, env):
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M"] + cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    wall, kb = r.stderr.strip().splitlines()[-1].split()
    return float(wall), int(kb) / 1024.0, r.stdout


HF_LOAD = (
    "import glob, os, huggingface_hub as h, safetensors.torch as st\n"
    "p = h.snapshot_download('bench/model', cache_dir={cache!r})\n"
    "tensors = {{}}\n"
    "for f in sorted(glob.glob(os.path.join(p, '*.safetensors'))):\n"
    "    tensors.update(st.load_file(f))\n"
    "print(sum(t.numel() * t.element_size() for t in tensors.values()))\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--rate-mbps", type=float, default=50.0, help="MB/s per connection")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wl-hub-load-bench-")
    try:
        total = make_repo(os.path.join(work, "repos"), args.size_mb, args.shards)
        srv = HubServer(os.path.join(work, "repos")).start()
        env = dict(os.environ, HF_ENDPOINT=srv.endpoint, HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ETAG_TIMEOUT="60")
        env.pop("HF_TOKEN", None)
        env.pop("PYTHONPATH", None)
        py = sys.executable
        tools = {
            "weightlift load (while downloading)": lambda c: [[CLI, "load", "bench/model", "--no-progress"],
                                                              {"HF_HUB_CACHE": c}],
            "weightlift download alone": lambda c: [[CLI, "download", "bench/model", "--cache-dir", c, "-q"], {}],
            "huggingface_hub 0.27 download + load": lambda c: [[py, "-c", HF_LOAD.format(cache=c)], {}],
        }
        if os.path.isdir(os.path.join(HF2, "huggingface_hub")):
            tools["huggingface_hub 2.x download + load"] = lambda c: [[py, "-c", HF_LOAD.format(cache=c)],
                                                                      {"PYTHONPATH": HF2}]
        try:
            import hf_transfer  # noqa: F401
            tools["huggingface_hub 0.27 + hf_transfer download + load"] = lambda c: [
                [py, "-c", HF_LOAD.format(cache=c)], {"HF_HUB_ENABLE_HF_TRANSFER": "1"}]
        except ImportError:
            pass
        srv.set_rate(int(args.rate_mbps * 1e6))
        results = {}
        for _ in range(args.runs):
            for name, make in tools.items():
                cache = os.path.join(work, "cache")
                shutil.rmtree(cache, ignore_errors=True)
                cmd, extra = make(cache)
                wall, rss, out = measure(cmd, dict(env, **extra))
                if name == "weightlift download alone":  # then load the snapshot: the two-pass row
                    lw, lrss, _ = measure([CLI, "load", out.strip(), "--no-progress"], env)
                    results.setdefault("weightlift download, then load", []).append((wall + lw, max(rss, lrss)))
                results.setdefault(name, []).append((wall, rss))
                shutil.rmtree(cache, ignore_errors=True)
        srv.stop()
        best = {k: min(v) for k, v in results.items()}
        median = {k: sorted(w for w, _ in v)[len(v) // 2] for k, v in results.items()}
        alone = best["weightlift download alone"][0]
        hf = best["huggingface_hub 0.27 download + load"][0]
        mib = total / (1 << 20)
        print("repo: %.0f MiB of tensors in %d shards; server throttled to %.0f MB/s per connection; "
              "best (and median) of %d" % (mib, args.shards, args.rate_mbps, args.runs))
        print("| tool | time s | MB/s | peak RSS MiB | RSS beyond tensors MiB | time / download alone | "
              "time / huggingface_hub 0.27 download+load | median s | median / download alone median |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        order = ["weightlift load (while downloading)", "weightlift download alone", "weightlift download, then load"]
        order += [k for k in best if k not in order]
        for name in order:
            wall, rss = best[name]
            loads = "load" in name and name != "weightlift download alone"
            beyond = "%.0f" % (rss - mib) if loads else "-"
            print("| %s | %.2f | %.1f | %.0f | %s | %.2fx | %.2fx | %.2f | %.2fx |"
                  % (name, wall, total / wall / 1e6, rss, beyond, wall / alone, wall / hf, median[name],
                     median[name] / median["weightlift download alone"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
