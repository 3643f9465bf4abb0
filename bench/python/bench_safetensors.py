#!/usr/bin/env python3
"""weightlift.safetensors against the safetensors package, the same calls on
the same files, each measurement in its own process. The peer is the
safetensors of this Python (.venv pins 0.8.0) for 0.8's API, and
safetensors 0.9.0rc1 for what 0.9 added (its pinned wheel, the one
tests/python/safetensors_suite/run.py installs in the cache for its control
run; --peer09 DIR for another copy):

  load_file        torch load_file(path), then every tensor copied into a
                   preallocated, touched buffer (as a weight loader copies it
                   into its parameter)
  load_file (call) load_file(path) alone: both map the file, so this is the
                   per-tensor cost of the API
  get_tensor       safe_open(path) + get_tensor(name) for every name, each read
  get_slice        safe_open(path) + get_slice(name)[: rows // 2] for every 2-D name, each copied
  save_file        save_file(tensors, new path) of tensors already in memory
  np load_file     numpy load_file(path), every array copied
  get_tensor_meta  (0.9) safe_open(path) + get_tensor_meta(name) for every name:
                   the header alone, no data read
  prefetch         (0.9) safe_open(path).prefetch(device="cuda:0"), every tensor
                   taken as it lands, the clock stopped after
                   torch.cuda.synchronize(); GB/s is the file's bytes over that
                   time. On a machine without a GPU, weightlift alone on the fake
                   GPU backend (WEIGHTLIFT_GPU_BACKEND=fake: host memory for device
                   memory, copies by threads), every tensor checked against the
                   host load: correctness and host-side cost only, its peer then
                   being safetensors' host load_file of the same file (the fake's
                   "device" copies are memcpy).

on two files: "large" (a Llama-shaped shard, fp16, --size) and "small"
(10,000+ small tensors of mixed dtypes: a model's norms, biases and
scales). Hot: the file in the page cache. Cold: its pages dropped first
(fdatasync + posix_fadvise DONTNEED). Runs alternate between the two
packages; the table keeps each one's median of --repeat (and the best, for
hot runs), with the process's peak RSS (VmHWM) beside it.

    .venv/bin/python bench/python/bench_safetensors.py [--size 512MB] [--repeat 5] [--json out.json]
    .venv/bin/python bench/python/bench_safetensors.py --ops prefetch,get_tensor_meta   # 0.9's additions
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
    if op in ("get_tensor_meta", "prefetch"):
        return _child_09(st, stt, op, path)
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


def _child_09(st, stt, op: str, path: str) -> dict:
    """The calls safetensors 0.9 added, timed after the handle is open."""
    import torch

    with st.safe_open(path, framework="pt") as f:
        names = f.keys()
        if op == "get_tensor_meta":
            t0 = time.perf_counter()
            metas = [f.get_tensor_meta(k) for k in names]
            dt = time.perf_counter() - t0
            assert len(metas) == len(names) and metas[-1].dtype
            return {"seconds": dt, "vmhwm": vm_hwm()}
        gpu = torch.cuda.is_available()
        t0 = time.perf_counter()
        with f.prefetch(device="cuda:0") as loader:
            got = dict(loader)
        if gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        hwm = vm_hwm()
    # Checked after the clock: every tensor's bytes against the host load.
    want = stt.load_file(path)
    assert list(got) and set(got) == set(want), (len(got), len(want))
    for k, t in want.items():
        g = got[k].cpu()
        assert g.dtype == t.dtype and g.shape == t.shape and torch.equal(g.view(-1).view(torch.uint8),
                                                                        t.view(-1).view(torch.uint8)), k
    return {"seconds": dt, "vmhwm": hwm, "bytes": sum(t.numel() * t.element_size() for t in want.values())}


def measure(impl: str, op: str, path: str, cold: bool, env: dict | None = None) -> dict:
    if cold:
        drop_cache(path)
    else:
        warm(path)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", impl, op, path],
                       capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise SystemExit(f"{impl} {op} {path} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


OPS = [("load_file", "load_file", True), ("load_file (call)", "load_file_call", False),
       ("get_tensor", "get_tensor", True), ("get_slice", "get_slice", True),
       ("save_file", "save_file", False), ("np load_file", "np_load_file", True),
       ("get_tensor_meta", "get_tensor_meta", False), ("prefetch", "prefetch", True)]
OPS_09 = ("get_tensor_meta", "prefetch")  # the peer is safetensors 0.9
# Without a GPU: weightlift's prefetch on the fake backend (host memory standing for the device).
FAKE_GPU = {"WEIGHTLIFT_GPU_BACKEND": "fake", "WEIGHTLIFT_TEST_TORCH_CUDA": "0"}


def peer09_path(given: str | None) -> str:
    """A folder holding safetensors 0.9.0rc1 (first on the peer's path): `given`,
    or the suite runner's pinned copy in the cache (installed once)."""
    if given:
        return given
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python", "safetensors_suite"))
    import run as suite  # tests/python/safetensors_suite/run.py

    path = suite.control_path("0.9.0rc1")
    if path is None:  # this Python's own safetensors is 0.9.0rc1
        return ""
    return path


def plan_runs(op: str, gpu: bool, peer09: str) -> dict:
    """impl -> (child op, extra environment) for one row: 0.9's calls against
    safetensors 0.9; prefetch without a GPU on the fake backend, against
    safetensors' host load_file."""
    peer_env = {"PYTHONPATH": peer09 + os.pathsep + os.environ.get("PYTHONPATH", "")} if peer09 else {}
    if op == "prefetch" and not gpu:
        return {"safetensors": ("load_file", {}), "weightlift": ("prefetch", FAKE_GPU)}
    if op in OPS_09:
        return {"safetensors": (op, peer_env), "weightlift": (op, {})}
    return {"safetensors": (op, {}), "weightlift": (op, {})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "OP", "PATH"))
    ap.add_argument("--size", default="512MB", help="size of the large file")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", help="where to write the files (default: a temporary folder)")
    ap.add_argument("--ops", help="comma-separated subset of: " + ",".join(o[1] for o in OPS))
    ap.add_argument("--files", default="large,small")
    ap.add_argument("--peer09", help="a folder holding safetensors 0.9.0rc1 (default: the suite runner's cached copy)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return 0

    import safetensors
    import torch

    d = a.dir or tempfile.mkdtemp(prefix="wl-st-bench-")
    files = make_files(d, parse_size(a.size))
    ops = [o for o in OPS if not a.ops or o[1] in a.ops.split(",")]
    gpu = torch.cuda.is_available()
    peer09 = peer09_path(a.peer09) if any(o[1] in OPS_09 for o in ops) else ""
    rows = []
    for which in a.files.split(","):
        path = files[which]
        for label, op, has_cold in ops:
            how = plan_runs(op, gpu, peer09)
            if op == "prefetch" and not gpu:
                label = "prefetch (fake GPU) vs host load_file"
            for cold in ((False, True) if has_cold else (False,)):
                runs = {i: [] for i in IMPLS}
                for r in range(a.repeat):
                    for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
                        runs[impl].append(measure(impl, how[impl][0], path, cold, how[impl][1]))
                row = {"file": which, "op": label, "cache": "cold" if cold else "hot"}
                for impl in IMPLS:
                    secs = [x["seconds"] for x in runs[impl]]
                    row[impl] = statistics.median(secs)
                    row[impl + "_best"] = min(secs)
                    row[impl + "_runs"] = secs
                    row[impl + "_rss"] = max(x["vmhwm"] for x in runs[impl])
                row["ratio"] = row["safetensors"] / row["weightlift"]
                row["ratio_best"] = row["safetensors_best"] / row["weightlift_best"]
                gbps = ""
                if op == "prefetch":
                    nbytes = runs["weightlift"][0]["bytes"]
                    for impl in IMPLS:
                        row[impl + "_gbps"] = nbytes / row[impl] / 1e9
                    gbps = f"   GB/s {row['safetensors_gbps']:6.2f} / {row['weightlift_gbps']:6.2f}"
                row["peer"] = "0.9.0rc1" if op in OPS_09 and how["safetensors"][0] == op else safetensors.__version__
                rows.append(row)
                print(f"{which:6} {label:17} {row['cache']:4}  safetensors {row['peer']} "
                      f"{row['safetensors'] * 1e3:9.1f} ms {row['safetensors_rss'] / 2**20:7.0f} MiB   "
                      f"weightlift {row['weightlift'] * 1e3:9.1f} ms {row['weightlift_rss'] / 2**20:7.0f} MiB   "
                      f"speedup {row['ratio']:5.2f}x (best {row['ratio_best']:5.2f}x){gbps}", flush=True)
    sizes = {k: os.path.getsize(v) for k, v in files.items()}
    print(f"files: large {sizes['large'] / 2**20:.0f} MiB, small {sizes['small'] / 2**20:.0f} MiB "
          f"(12,000 tensors); safetensors {safetensors.__version__}"
          + (", 0.9.0rc1 for get_tensor_meta and prefetch" if peer09 else "")
          + ("" if gpu or not any(o[1] == "prefetch" for o in ops) else "; no GPU: prefetch on the fake backend"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "sizes": sizes, "safetensors": safetensors.__version__}, f, indent=1)
    if not a.dir:
        import shutil

        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
