#!/usr/bin/env python3
"""One peer loads every tensor of a checkpoint into owned CPU memory.

Prints one JSON object: {"peer", "seconds", "bytes", "tensors", "peak_rss"}.
Time covers only the load (imports and interpreter start are excluded);
peak RSS is the process's (interpreter and torch included).
"""
import glob
import json
import os
import resource
import sys
import time


def files_of(path):
    if os.path.isdir(path):
        fs = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        return fs or sorted(glob.glob(os.path.join(path, "*.bin")))
    return [path]


def nbytes(t):
    return t.numel() * t.element_size()


def run_safetensors(files):
    from safetensors import safe_open
    out = {}
    for f in files:
        with safe_open(f, framework="pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k).clone()  # get_tensor maps the file: own a copy
    return out


def run_torch_load(files):
    import torch
    out = {}
    for f in files:
        out.update(torch.load(f, map_location="cpu"))
    return out


def run_runai(files):
    from runai_model_streamer import SafetensorsStreamer
    out = {}
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for name, t in s.get_tensors():
            out[name] = t.clone()  # the streamer reuses its buffer: keep an owned copy
    return out


def run_fastsafetensors(files):
    from fastsafetensors import fastsafe_open
    out = {}
    with fastsafe_open(filenames=files, nogds=True, device="cpu") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k).clone()
    return out


def main():
    peer, path = sys.argv[1], sys.argv[2]
    files = files_of(path)
    fn = {"safetensors": run_safetensors, "torch.load": run_torch_load, "runai-model-streamer": run_runai,
          "fastsafetensors": run_fastsafetensors}[peer]
    import torch  # noqa: F401  (imported before timing for every peer)
    t0 = time.perf_counter()
    out = fn(files)
    secs = time.perf_counter() - t0
    total = sum(nbytes(t) for t in out.values())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peer": peer, "seconds": secs, "bytes": total, "tensors": len(out), "peak_rss": rss}))


if __name__ == "__main__":
    main()
