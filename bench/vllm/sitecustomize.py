"""bench/vllm only (on PYTHONPATH of the benchmarked vLLM processes): times
vLLM's whole model load in the process that does it. vLLM's CPU model runner
does not log "Model loading took" as its GPU runner does, and the Run:ai
loader logs no "Loading weights took", so this wraps BaseModelLoader.load_model
(model creation, load_weights, process_weights_after_loading) and the
loader's load_weights when vLLM imports it, and prints one line:

    [bench] model load 1.234567 s, load_weights 0.123456 s, peak RSS 1234567890 bytes, pid 123

Nothing else of vLLM changes."""
import importlib.abc
import importlib.util
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
            inner = cls.load_model

            def load_model(self, *args, **kwargs):
                weights = []
                load_weights = self.load_weights  # every loader's, timed alike (runai logs no figure)

                def timed(*a, **k):
                    t = time.perf_counter()
                    try:
                        return load_weights(*a, **k)
                    finally:
                        weights.append(time.perf_counter() - t)

                self.load_weights = timed
                t0 = time.perf_counter()
                try:
                    model = inner(self, *args, **kwargs)
                finally:
                    del self.load_weights
                print(f"[bench] model load {time.perf_counter() - t0:.6f} s, load_weights {sum(weights):.6f} s, "
                      f"peak RSS {_vm_hwm()} bytes, pid {os.getpid()}", flush=True)
                return model

            cls.load_model = load_model

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
