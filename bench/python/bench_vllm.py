#!/usr/bin/env python3
"""vLLM's iterators, the reference's code paths (reference_iterators.py: the
real safetensors 0.8 and torch) against weightlift's same-named ones, in one
run, each in its own process, consumed as vLLM's default_weight_loader does:
every yielded tensor is copied into a preallocated, already-touched
parameter of its name. Plus weightlift.load_into (the engine's threads read
straight into those parameters) and the machine's limit: N Python threads
preadv() each tensor straight into its parameter.
Hot, also the copies alone (out of tensors mapped in beforehand: the ceiling
of any iterator whose tensors the consumer copies) and the same through new
memory (the ceiling of any iterator handing out tensors that own memory).
Cold, also the page cache's fill rate (8 threads pread every block, nothing
consumed), the ceiling of any prefetch strategy.

Hot: the files in the page cache. Cold: their pages dropped first
(posix_fadvise DONTNEED, after an fsync). Round-robin passes, best kept.
Peak RSS is the child's VmHWM; "growth" subtracts the touched parameters.

    .venv/bin/python bench/python/bench_vllm.py --size 1GB [--repeat 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def vm_hwm() -> int:
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


def warm(files) -> None:
    buf = bytearray(16 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# ---- methods (run in a child) --------------------------------------------------------------------


def _consume(it, params):
    import torch

    n = 0
    with torch.no_grad():
        for name, t in it:
            params[name].copy_(t)
            n += t.numel() * t.element_size()
    return n


def _ref():
    sys.path.insert(0, HERE)
    import reference_iterators

    return reference_iterators


def limit_preadv(st, pt, params, threads=4):
    """N threads, each preadv()-ing whole tensors straight into their parameters."""
    import concurrent.futures

    import weightlift

    jobs = []
    for p in st:
        for name, _dtype, _shape, off, nbytes in weightlift._core.SafetensorsFile(p, "lazy").tensors():
            jobs.append((p, off, nbytes, name))
    fds = {p: os.open(p, os.O_RDONLY) for p in st}

    def one(job):
        p, off, nbytes, name = job
        import torch

        mv = memoryview(params[name].reshape(-1).view(torch.uint8).numpy()) if nbytes else None
        done = 0
        while done < nbytes:
            done += os.preadv(fds[p], [mv[done:]], off + done)
        return nbytes

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        n = sum(ex.map(one, jobs))
    for fd in fds.values():
        os.close(fd)
    return n


def limit_fill(st, pt, params, threads=8, block=16 << 20):
    """Cold: the page cache's fill rate, the ceiling of any prefetch strategy
    (the reference's or ours): N threads pread() every block of the files
    into a reused buffer, nothing consumed."""
    import concurrent.futures

    jobs = [(p, off, min(block, os.path.getsize(p) - off)) for p in st for off in range(0, os.path.getsize(p), block)]
    fds = {p: os.open(p, os.O_RDONLY) for p in st}
    local = __import__("threading").local()

    def one(job):
        p, off, n = job
        if getattr(local, "buf", None) is None:
            local.buf = bytearray(block)
        return os.preadv(fds[p], [memoryview(local.buf)[:n]], off)

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        n = sum(ex.map(one, jobs))
    for fd in fds.values():
        os.close(fd)
    return n


def limit_owned(st, pt, params):
    """Hot: the ceiling of any iterator that hands out tensors owning new
    memory (the stream strategy into buffers, the reference's eager): each
    tensor copied out of its mapping into freshly allocated memory, then
    into its parameter; mappings populated before the clock starts."""
    import torch

    import weightlift

    views = list(weightlift.stream_weights(st, "lazy", max_queued_bytes=1 << 40))

    def run():
        n = 0
        with torch.no_grad():
            for name, t in views:
                owned = torch.empty_like(t)
                owned.copy_(t)
                params[name].copy_(owned)
                n += t.numel() * t.element_size()
                del owned
        return n

    return run


def limit_copy(st, pt, params):
    """The consumer's copies alone: every tensor mapped in (file views, pages
    populated) before the clock starts, then only the copies into the
    parameters are timed. No iterator that hands out tensors to be copied
    can beat this (hot)."""
    import weightlift

    views = list(weightlift.stream_weights(st, "lazy", max_queued_bytes=1 << 40))
    return lambda: _consume(views, params)


def m(kind, which, **kw):
    def run(st, pt, params):
        import weightlift

        mod = _ref() if which == "reference" else weightlift
        files = st if kind.startswith("st") else pt
        if kind == "st":
            it = mod.safetensors_weights_iterator(files, False, kw.get("strategy"))
        elif kind == "st_mt":
            it = mod.multi_thread_safetensors_weights_iterator(files, False)
        elif kind == "pt":
            it = mod.pt_weights_iterator(files, False)
        elif kind == "pt_mt":
            it = mod.multi_thread_pt_weights_iterator(files, False)
        else:
            raise ValueError(kind)
        return _consume(it, params)

    return run


def wl_stream(strategy, **opts):
    def run(st, pt, params):
        import weightlift

        return _consume(weightlift.stream_weights(st, strategy, **opts), params)

    return run


def wl_load_into(st, pt, params):
    import weightlift

    r = weightlift.load_into(st, params)
    return r["bytes"]


METHODS = {
    "limit: 4 threads preadv into the parameters": limit_preadv,
    "limit: the copies alone (tensors mapped in beforehand)": limit_copy,
    "limit: page-cache fill (8 threads pread, nothing consumed)": limit_fill,
    "limit: owned tensors (a copy into new memory, then the parameter)": limit_owned,
    "reference safetensors_weights_iterator lazy": m("st", "reference", strategy="lazy"),
    "weightlift safetensors_weights_iterator lazy": m("st", "weightlift", strategy="lazy"),
    "reference safetensors_weights_iterator None": m("st", "reference", strategy=None),
    "weightlift safetensors_weights_iterator None": m("st", "weightlift", strategy=None),
    "reference safetensors_weights_iterator eager": m("st", "reference", strategy="eager"),
    "weightlift safetensors_weights_iterator eager": m("st", "weightlift", strategy="eager"),
    "reference safetensors_weights_iterator prefetch": m("st", "reference", strategy="prefetch"),
    "weightlift safetensors_weights_iterator prefetch": m("st", "weightlift", strategy="prefetch"),
    "reference multi_thread_safetensors_weights_iterator": m("st_mt", "reference"),
    "weightlift multi_thread_safetensors_weights_iterator": m("st_mt", "weightlift"),
    "reference pt_weights_iterator": m("pt", "reference"),
    "weightlift pt_weights_iterator": m("pt", "weightlift"),
    "reference multi_thread_pt_weights_iterator": m("pt_mt", "reference"),
    "weightlift multi_thread_pt_weights_iterator": m("pt_mt", "weightlift"),
    "weightlift stream_weights lazy": wl_stream("lazy"),
    "weightlift stream_weights stream (buffers)": wl_stream("stream", file_views=False),
    "weightlift load_into (stream into the parameters)": wl_load_into,
}


def child(method: str, st, pt, cold: bool) -> None:
    import safetensors.torch  # noqa: F401
    import torch

    import weightlift

    params = {}
    for name, dtype, shape in weightlift._core.list_tensors(st):
        t = torch.empty(shape, dtype=weightlift._tensors.TORCH_DTYPES[dtype])
        t.view(-1).view(torch.uint8).fill_(1) if t.numel() else None  # touched: vLLM's params exist already
        params[name] = t
    if cold:
        drop_cache(st + pt)
    base = vm_hwm()
    t0 = time.perf_counter()
    n = METHODS[method](st, pt, params)
    if callable(n):  # a limit whose preparation is not timed
        t0 = time.perf_counter()
        n = n()
    dt = time.perf_counter() - t0
    print(json.dumps({"bytes": n, "seconds": dt, "peak_rss": vm_hwm(), "base_rss": base}))


def run_child(method, st, pt, cold):
    out = subprocess.run([sys.executable, __file__, "--child", method, "--st", json.dumps(st), "--pt",
                          json.dumps(pt)] + (["--cold"] if cold else []), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    ap.add_argument("--dir", default="/tmp/wl-bench-vllm")
    ap.add_argument("--cli", default=os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift")))
    ap.add_argument("--methods", default="", help="comma-separated substrings of method names (default: all)")
    ap.add_argument("--caches", default="hot,cold")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--child", default="")
    ap.add_argument("--st", default="[]")
    ap.add_argument("--pt", default="[]")
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    if a.child:
        child(a.child, json.loads(a.st), json.loads(a.pt), a.cold)
        return
    st, pt = prepare(os.path.join(a.dir, a.size), a.size, a.cli)
    import safetensors
    import torch

    total = sum(os.path.getsize(p) for p in st)
    print(f"checkpoint: {len(st)} safetensors shards, {total / 1e9:.2f} GB (and as {len(pt)} .bin files); "
          f"safetensors {safetensors.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    wanted = [k for k in METHODS if not a.methods or any(s in k for s in a.methods.split(","))]
    rows = []
    for cache in a.caches.split(","):
        best = {}
        for _ in range(a.repeat):
            for k in wanted:
                if (cache == "cold" and ("copies alone" in k or "owned tensors" in k)) or \
                        (cache == "hot" and "page-cache fill" in k):
                    continue
                if cache == "hot":
                    warm(st if "pt_" not in k and " pt" not in k else pt)
                r = run_child(k, st, pt, cache == "cold")
                if k not in best or r["seconds"] < best[k]["seconds"]:
                    best[k] = r
        for k in wanted:
            if k not in best:
                continue
            r = best[k]
            rows.append({"cache": cache, "method": k, "GB/s": r["bytes"] / r["seconds"] / 1e9,
                         "seconds": r["seconds"], "peak_rss_MiB": r["peak_rss"] / 2**20,
                         "growth_MiB": (r["peak_rss"] - r["base_rss"]) / 2**20})
    print("\n| cache | iterator | GB/s | vs reference | vs reference lazy | vs preadv limit | peak RSS MiB "
          "| growth MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    by = {(r["cache"], r["method"]): r for r in rows}
    for r in rows:
        ref = by.get((r["cache"], r["method"].replace("weightlift", "reference", 1)))
        lim = by.get((r["cache"], "limit: 4 threads preadv into the parameters"))
        vs_ref = f"{r['GB/s'] / ref['GB/s']:.2f}x" if ref and r["method"].startswith("weightlift") else ""
        lazy = by.get((r["cache"], "reference safetensors_weights_iterator lazy"))
        vs_lim = f"{r['GB/s'] / lim['GB/s']:.2f}" if lim else ""
        vs_lazy = f"{r['GB/s'] / lazy['GB/s']:.2f}x" if lazy else ""
        print(f"| {r['cache']} | {r['method']} | {r['GB/s']:.2f} | {vs_ref} | {vs_lazy} | {vs_lim} | "
              f"{r['peak_rss_MiB']:.0f} | {r['growth_MiB']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
