"""One rank of the torch.distributed (gloo) tests in test_distributed.py.

    python dist_worker.py RANK WORLD PORT SPEC.json OUT.json

Joins a gloo group on 127.0.0.1:PORT, runs every scenario of SPEC in order
with weightlift._distributed.load_distributed and writes, per scenario, each
tensor's SHA-256, dtype and shape, or the error, plus the bytes this process
read from storage (/proc/self/io) and the engine's own count.
"""
import datetime
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from pagecache import drop_cache  # noqa: F401  (test_distributed imports it from here)
from weightlift._distributed import load_distributed


def storage_read() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def entry_point(entry, files, stats):
    """The entry point's tensors; `stats` gets the engine's figures when it
    went through the distributed loader (a spy on load_distributed)."""
    from weightlift import _distributed
    from weightlift import vllm_compat as vc

    if not hasattr(_distributed, "_unspied"):
        _distributed._unspied = _distributed.load_distributed
    _distributed.load_distributed = lambda *a, **k: _distributed._unspied(*a, stats=stats, **k)

    if entry == "safetensors":
        return vc.safetensors_weights_iterator(files, False, distributed=True)
    if entry == "multi_thread":
        return vc.multi_thread_safetensors_weights_iterator(files, False, max_workers=2, distributed=True)
    if entry == "runai":
        return vc.runai_safetensors_weights_iterator(files, False, is_distributed=True)
    if entry == "env":  # WEIGHTLIFT_DISTRIBUTED=1, no keyword
        os.environ["WEIGHTLIFT_DISTRIBUTED"] = "1"
        try:
            return list(vc.safetensors_weights_iterator(files, False))
        finally:
            del os.environ["WEIGHTLIFT_DISTRIBUTED"]
    if entry == "single":  # not asked: every rank reads everything itself
        return vc.safetensors_weights_iterator(files, False)
    raise ValueError(entry)


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    spec = json.load(open(sys.argv[4]))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec.get("timeout", 30)))
    results = []
    for sc in spec["scenarios"]:
        files = sc["files"][rank] if sc.get("per_rank") else sc["files"]
        if sc.get("cold"):
            if rank == 0:
                drop_cache(sc["drop"])
            dist.barrier()
        opts = dict(sc.get("engine", {}))
        experts = sc.get("experts")
        res = {"name": sc["name"]}
        stats = {}
        before = storage_read()
        t0 = time.monotonic()
        try:
            got = {}
            if sc.get("entry"):  # one of the reference's entry points, asked to spread the reads
                tensors = entry_point(sc["entry"], files, stats)
            else:
                tensors = load_distributed(files, shard_rules=sc.get("shard_rules"),
                                           local_expert_ids=None if experts is None else experts[rank],
                                           stats=stats, max_queued_bytes=sc.get("max_queued_bytes", 1 << 30),
                                           **opts)
            for name, t in tensors:
                got[name] = [sha(t), str(t.dtype), list(t.shape)]
                if sc.get("kill_rank") == rank:
                    os.kill(os.getpid(), signal.SIGKILL)
            res.update(ok=True, tensors=got)
        except Exception as e:  # the test checks every rank's message
            res.update(ok=False, error=f"{type(e).__name__}: {e}")
        res["seconds"] = time.monotonic() - t0
        res["storage"] = storage_read() - before
        res["bytes_read"] = stats.get("bytes_read")
        res["bytes_exchanged"] = stats.get("bytes_exchanged")
        res["direct_io"] = bool(stats.get("direct_io"))
        results.append(res)
        if sc.get("barrier", True):
            dist.barrier()
    json.dump(results, open(sys.argv[5], "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
