#!/usr/bin/env python3
"""weightlift.safetensors against the safetensors package (0.8), the same
calls on the same files, each measurement in its own process:

  load_file        torch load_file(path), then every tensor copied into a
                   preallocated, touched buffer (as a weight loader copies it
                   into its parameter)
  load_file (call) load_file(path) alone: both map the file, so this is the
                   per-tensor cost of the API
  get_tensor       safe_open(path) + get_tensor(name) for every name, each read
  get_slice        safe_open(path) + get_slice(name)[: rows // 2] for every 2-D name, each copied
  save_file        save_file(tensors, new path) of tensors already in memory
  np load_file     numpy load_file(path), every array copied

on two files: "large" (a Llama-shaped shard, fp16, --size) and "small"
(10,000+ small tensors of mixed dtypes: a model's norms, biases and
scales). Hot: the file in the page cache. Cold: its pages dropped first
(fdatasync + posix_fadvise DONTNEED). Runs alternate between the two
packages; the table keeps each one's median of --repeat (and the best, for
hot runs), with the process's peak RSS (VmHWM) beside it.

    .venv/bin/python bench/python/bench_safetensors.py [--size 512MB] [--repeat 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("safetensors", "weightlift")


def vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: str) -> None:
    buf = bytearray(16 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def parse_size(s: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for u, m in units.items():
        if s.upper().endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


# ---- the files ---------------------------------------------------------------------------------

def make_files(d: str, size: int) -> dict:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    large, total, layer = {}, 0, 0
    hidden, inter = 2048, 5632
    while total < size:
        for name, shape in ((f"model.layers.{layer}.self_attn.qkv_proj.weight", (3 * hidden, hidden)),
                            (f"model.layers.{layer}.self_attn.o_proj.weight", (hidden, hidden)),
                            (f"model.layers.{layer}.mlp.gate_up_proj.weight", (2 * inter, hidden)),
                            (f"model.layers.{layer}.mlp.down_proj.weight", (hidden, inter)),
                            (f"model.layers.{layer}.input_layernorm.weight", (hidden,))):
            large[name] = torch.randn(shape, generator=g).to(torch.float16)
            total += large[name].numel() * 2
        layer += 1
    small = {}
    dtypes = (torch.float32, torch.float16, torch.int32, torch.int64, torch.uint8)
    for i in range(12_000):
        n = 16 + (i * 37) % 2048
        small[f"blocks.{i // 8}.part{i % 8}.weight"] = torch.randn(n, generator=g).to(dtypes[i % len(dtypes)])
    files = {"large": os.path.join(d, "large.safetensors"), "small": os.path.join(d, "small.safetensors")}
    save_file(large, files["large"])
    save_file(small, files["small"])
    return files


# ---- one measurement (child process) --------------------------------------------------------------

_SINK = None


def _consume(t) -> None:
    """Copies the tensor's bytes into a preallocated, touched buffer."""
    import torch

    n = t.numel() * t.element_size()
    if n:
        _SINK[:n].copy_(t.reshape(-1).view(torch.uint8))


def child(impl: str, op: str, path: str) -> dict:
    import numpy as np
    import torch

    global _SINK
    torch.set_num_threads(1)
    _SINK = torch.ones(64 << 20, dtype=torch.uint8)  # larger than any tensor of the files
    if impl == "safetensors":
        import safetensors as st
        import safetensors.numpy as stnp
        import safetensors.torch as stt
    else:
        import weightlift.safetensors as st
        import weightlift.safetensors.numpy as stnp
        import weightlift.safetensors.torch as stt
    out_dir = os.path.dirname(path)
    pre = None
    if op == "save_file":
        pre = {k: v.clone() for k, v in stt.load_file(path).items()}
    t0 = time.perf_counter()
    if op == "load_file":
        for t in stt.load_file(path).values():
            _consume(t)
    elif op == "load_file_call":
        d = stt.load_file(path)
        assert d
    elif op == "get_tensor":
        with st.safe_open(path, framework="pt") as f:
            for k in f.keys():
                _consume(f.get_tensor(k))
    elif op == "get_slice":
        with st.safe_open(path, framework="pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                shape = s.get_shape()
                if len(shape) == 2:
                    _consume(s[: shape[0] // 2])
    elif op == "save_file":
        out = os.path.join(out_dir, f"out-{impl}-{os.getpid()}.safetensors")
        stt.save_file(pre, out)
    elif op == "np_load_file":
        sink = _SINK.numpy()
        for a in stnp.load_file(path).values():
            if a.size:
                sink[:a.nbytes] = a.reshape(-1).view(np.uint8)
    else:
        raise SystemExit(f"unknown op {op}")
    dt = time.perf_counter() - t0
    if op == "save_file":
        os.remove(out)
    return {"seconds": dt, "vmhwm": vm_hwm()}


def measure(impl: str, op: str, path: str, cold: bool) -> dict:
    if cold:
        drop_cache(path)
    else:
        warm(path)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", impl, op, path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{impl} {op} {path} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


OPS = [("load_file", "load_file", True), ("load_file (call)", "load_file_call", False),
       ("get_tensor", "get_tensor", True), ("get_slice", "get_slice", True),
       ("save_file", "save_file", False), ("np load_file", "np_load_file", True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "OP", "PATH"))
    ap.add_argument("--size", default="512MB", help="size of the large file")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", help="where to write the files (default: a temporary folder)")
    ap.add_argument("--ops", help="comma-separated subset of: " + ",".join(o[1] for o in OPS))
    ap.add_argument("--files", default="large,small")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return 0

    import safetensors

    d = a.dir or tempfile.mkdtemp(prefix="wl-st-bench-")
    files = make_files(d, parse_size(a.size))
    ops = [o for o in OPS if not a.ops or o[1] in a.ops.split(",")]
    rows = []
    for which in a.files.split(","):
        path = files[which]
        for label, op, has_cold in ops:
            for cold in ((False, True) if has_cold else (False,)):
                runs = {i: [] for i in IMPLS}
                for r in range(a.repeat):
                    for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
                        runs[impl].append(measure(impl, op, path, cold))
                row = {"file": which, "op": label, "cache": "cold" if cold else "hot"}
                for impl in IMPLS:
                    secs = [x["seconds"] for x in runs[impl]]
                    row[impl] = statistics.median(secs)
                    row[impl + "_best"] = min(secs)
                    row[impl + "_runs"] = secs
                    row[impl + "_rss"] = max(x["vmhwm"] for x in runs[impl])
                row["ratio"] = row["safetensors"] / row["weightlift"]
                row["ratio_best"] = row["safetensors_best"] / row["weightlift_best"]
                rows.append(row)
                print(f"{which:6} {label:17} {row['cache']:4}  safetensors {row['safetensors'] * 1e3:9.1f} ms "
                      f"{row['safetensors_rss'] / 2**20:7.0f} MiB   weightlift {row['weightlift'] * 1e3:9.1f} ms "
                      f"{row['weightlift_rss'] / 2**20:7.0f} MiB   speedup {row['ratio']:5.2f}x "
                      f"(best {row['ratio_best']:5.2f}x)", flush=True)
    sizes = {k: os.path.getsize(v) for k, v in files.items()}
    print(f"files: large {sizes['large'] / 2**20:.0f} MiB, small {sizes['small'] / 2**20:.0f} MiB "
          f"(12,000 tensors); safetensors {safetensors.__version__}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "sizes": sizes, "safetensors": safetensors.__version__}, f, indent=1)
    if not a.dir:
        import shutil

        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
