"""bench/vllm only (on PYTHONPATH of the benchmarked vLLM processes): times
vLLM's whole model load in the process that does it. vLLM's CPU model runner
does not log "Model loading took" as its GPU runner does, and the Run:ai
loader logs no "Loading weights took", so this wraps each loader's load_model
(model creation, load_weights, process_weights_after_loading) and the
loader's load_weights when vLLM imports it, and prints one line:

    [bench] model load 1.234567 s, load_weights 0.123456 s, peak RSS 1234567890 bytes, pid 123,
            create 1.0 s, post 0.1 s, resident 1000/1000 mapped 500/500 bytes

create: the model's construction (BaseModelLoader.create_model: modules
built, parameters allocated, untouched); post: process_weights_after_loading
(the CPU backend's weight repacking). The rest of `model load` is
load_weights plus vLLM's gc/empty_cache calls.

resident: once load_model has returned (outside the timing), how many of
the bytes of the model's host parameters are in memory (mincore over their
pages): every parameter's, and of them those whose memory maps a file
(weightlift's map_params: a view of the checkpoint's pages). A load_model
that returns with mapped pages not yet read would move disk reads into the
first inference; bench/vllm/run.py fails the bench on it.

Nothing else of vLLM changes."""
import ctypes
import importlib.abc
import importlib.util
import mmap
import os
import sys
import time

_TARGET = "vllm.model_executor.model_loader.base_loader"


def _vm_hwm() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _file_ranges() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of files (/proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) >= 6 and parts[4] != "0" and parts[5].startswith("/"):
                a, b = parts[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    return out


def _resident_pages(addr: int, n: int) -> tuple[int, int]:
    """(resident pages, pages) of [addr, addr+n), mincore."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    a, b = addr // page * page, (addr + n + page - 1) // page * page
    vec = (ctypes.c_ubyte * ((b - a) // page))()
    if libc.mincore(a, b - a, vec) != 0:
        return 0, len(vec)
    return sum(v & 1 for v in vec), len(vec)


def residency(model) -> str:
    """'resident R/T mapped MR/MT bytes' over the model's host parameters
    (each storage once); mapped: those lying in a file mapping."""
    import torch

    files = _file_ranges()
    page = mmap.PAGESIZE
    seen = set()
    total = resident = mtotal = mresident = 0
    for p in model.parameters():
        if p.device.type != "cpu" or p.layout != torch.strided or p.numel() == 0:
            continue
        addr, n = p.data_ptr(), p.numel() * p.element_size()
        if (addr, n) in seen:
            continue
        seen.add((addr, n))
        r, pages = _resident_pages(addr, n)
        got = min(r * page, n) if r < pages else n
        total += n
        resident += got
        if any(s <= addr < e for s, e in files):
            mtotal += n
            mresident += got
    return f"resident {resident}/{total} mapped {mresident}/{mtotal} bytes"


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            cls = module.BaseModelLoader
            phases = {}

            def timed_phase(key, fn):
                def wrapper(*a, **k):
                    t = time.perf_counter()
                    try:
                        return fn(*a, **k)
                    finally:
                        phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
                return wrapper

            module.process_weights_after_loading = timed_phase("post", module.process_weights_after_loading)
            create_model = cls.create_model

            def create(self, *a, **k):  # a subclass's override (weightlift's) is timed from inside it
                return timed_phase("create", lambda: create_model(self, *a, **k))()

            cls.create_model = create

            def timed_load_model(self, inner):
                def load_model(*args, **kwargs):
                    weights = []
                    load_weights = self.load_weights  # every loader's, timed alike (runai logs no figure)

                    def timed(*a, **k):
                        t = time.perf_counter()
                        try:
                            return load_weights(*a, **k)
                        finally:
                            weights.append(time.perf_counter() - t)

                    self.load_weights = timed
                    phases.clear()
                    t0 = time.perf_counter()
                    try:
                        model = inner(*args, **kwargs)
                    finally:
                        del self.load_weights
                    took = time.perf_counter() - t0
                    print(f"[bench] model load {took:.6f} s, load_weights {sum(weights):.6f} s, "
                          f"peak RSS {_vm_hwm()} bytes, pid {os.getpid()}, create {phases.get('create', 0):.6f} s, "
                          f"post {phases.get('post', 0):.6f} s, {residency(model)}", flush=True)
                    return model

                return load_model

            init = cls.__init__

            def __init__(self, *a, **k):
                init(self, *a, **k)
                # The instance's own load_model, whichever class defines it (a
                # loader that overrides load_model is timed from its first line).
                self.load_model = timed_load_model(self, self.load_model)

            cls.__init__ = __init__

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
