"""One Python door of the GPU benchmark (bench/gpu/run.sh), in a process of its own:

    python doors.py DOOR DIR REF.jsonl

DOOR: fastsafetensors | instanttensor | load_file | safetensors (the peer:
safetensors.torch.load_file(device="cuda")) | limit (torch's pinned 1 GiB
host-to-device copy) | dummy (weightlift's dummy weights on the device
against the CPU fill). The process first makes torch's CUDA context (a vLLM
worker has one before it loads), then loads DIR's safetensors files
$WL_DOOR_LOADS times (3): the first is the first load of the process, the
best of the others the steady figure. The last load's tensors are copied
back and their SHA-256 compared with REF.jsonl (`weightlift load --checksum
--format jsonl`), unless WL_DOOR_CHECK=0.
Prints one JSON line: GB/s first and steady, peak RSS, the engine's
once-per-process costs, whether every tensor matched.

Without torch CUDA (the dry run on the fake backend: WEIGHTLIFT_GPU_BACKEND=fake
WEIGHTLIFT_TEST_TORCH_CUDA=0) the weightlift doors run on the fake and the
peer and the limit report "n/a".
"""
import glob
import hashlib
import json
import os
import resource
import sys
import time

import torch


def cuda() -> bool:
    return torch.cuda.is_available()


def sync():
    if cuda():
        torch.cuda.synchronize()


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def iterate(door, files):
    """(name, tensor) of one load through `door`."""
    if door == "fastsafetensors":
        from weightlift.vllm_compat import fastsafetensors_weights_iterator

        return fastsafetensors_weights_iterator(files, False)
    if door == "instanttensor":
        from weightlift.vllm_compat import instanttensor_weights_iterator

        return instanttensor_weights_iterator(files, False)
    if door == "load_file":
        import weightlift

        return (item for f in files for item in weightlift.load_file(f, device="cuda").items())
    if door == "safetensors":
        from safetensors.torch import load_file

        return (item for f in files for item in load_file(f, device="cuda").items())
    raise SystemExit(f"unknown door {door!r}")


def limit():
    if not cuda():
        return {"door": "limit", "na": "torch has no CUDA"}
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8).pin_memory()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    sync()
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        best = max(best, n / (time.perf_counter() - t0) / 1e9)
    return {"door": "limit", "gbps": best}


def dummy():
    import weightlift
    from weightlift import _params

    if not cuda():
        return {"door": "dummy", "na": "torch has no CUDA"}
    ok = []
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        cpu, dev = torch.empty(1 << 20, dtype=dt), torch.empty(1 << 20, dtype=dt, device="cuda")
        _params.initialize_single_dummy_weight(cpu, -1e-3, 1e-3, 1234)
        _params.initialize_single_dummy_weight(dev, -1e-3, 1e-3, 1234)
        ok.append(bool(torch.equal(cpu.view(torch.uint8), dev.cpu().view(torch.uint8))))
    return {"door": "dummy", "ok": all(ok), "costs": weightlift._core.gpu_process_costs()["text"]}


def main():
    door = sys.argv[1]
    if door == "limit":
        print(json.dumps(limit()))
        return
    if door == "dummy":
        print(json.dumps(dummy()))
        return
    directory, ref_path = sys.argv[2], sys.argv[3]
    loads = int(os.environ.get("WL_DOOR_LOADS", "3"))
    check = os.environ.get("WL_DOOR_CHECK", "1") != "0"
    if door == "safetensors" and not cuda():
        print(json.dumps({"door": door, "na": "torch has no CUDA"}))
        return
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    if cuda():
        torch.zeros(1, device="cuda")  # torch's context, as a serving process has before it loads
        sync()
    times, nbytes, last = [], 0, None
    for _ in range(loads):
        last = None  # free the previous load's device memory first
        t0 = time.perf_counter()
        got, n = [], 0
        for name, t in iterate(door, files):
            got.append((name, t))
            n += t.numel() * t.element_size()
        sync()
        times.append(time.perf_counter() - t0)
        nbytes, last = n, got
    ref = {}
    with open(ref_path) as f:
        for line in f:
            r = json.loads(line)
            ref[r["name"]] = r["sha256"]
    mism = [name for name, t in last if ref.get(name) != sha(t)] if check else []
    missing = len(ref) - len({name for name, _ in last})
    out = {
        "door": door,
        "bytes": nbytes,
        "first_gbps": nbytes / times[0] / 1e9,
        "steady_gbps": nbytes / min(times[1:]) / 1e9 if len(times) > 1 else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tensors": len(last),
        "equal": not mism and missing == 0,
        "mismatch": mism[:5],
        "device": str(last[0][1].device) if last else "",
    }
    if door != "safetensors":
        from weightlift import _core

        out["costs"] = _core.gpu_process_costs()["text"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
