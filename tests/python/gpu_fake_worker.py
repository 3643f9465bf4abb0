"""Every Python device entry point, end to end on the fake GPU backend (run by
test_gpu_doors.py in a process of its own: WEIGHTLIFT_GPU_BACKEND=fake and
WEIGHTLIFT_TEST_TORCH_CUDA=N, see weightlift._gpu).

    python gpu_fake_worker.py SPEC.json OUT.json [RANK WORLD PORT]

With RANK WORLD PORT it first joins a gloo group of WORLD processes on
127.0.0.1:PORT (the reference iterators then load over the group, and every
rank but 0 gets a disabled progress bar). Writes, per entry point, each
tensor's name, dtype, shape and SHA-256 in the order yielded, or the error.
"""
import hashlib
import json
import sys
import traceback

import torch
import torch.utils.dlpack


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def rows(items):
    out = []
    for name, t in items:
        assert isinstance(t, torch.Tensor), type(t)
        out.append([name, str(t.dtype), list(t.shape), sha(t), t.device.type])
    return out


def main():
    spec = json.load(open(sys.argv[1]))
    world = 1
    if len(sys.argv) > 3:
        import torch.distributed as dist

        rank, world, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    import weightlift
    from weightlift import _core, _gpu, _params
    from weightlift.vllm_compat import (
        fastsafetensors_weights_iterator,
        instanttensor_weights_iterator,
        multi_thread_pt_weights_iterator,
        pt_weights_iterator,
    )

    files, pt, device = spec["files"], spec["pt"], spec.get("device", "cuda")
    result = {"backend": _core.gpu_backend_name(), "seam": _gpu.test_seam_device()}

    def run(name, fn):
        try:
            result[name] = fn()
        except Exception as e:  # the error is the result
            result[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}

    for bar in (False, True):
        run(f"fastsafetensors/{bar}", lambda bar=bar: rows(fastsafetensors_weights_iterator(files, bar)))
        run(f"instanttensor/{bar}", lambda bar=bar: rows(instanttensor_weights_iterator(files, bar)))
    if world == 1:
        run("load_file", lambda: [rows(weightlift.load_file(f, device=device).items()) for f in files])
        run("load_file/cpu", lambda: [rows(weightlift.load_file(f).items()) for f in files])

        def per_tensor():
            out = []
            for f in files:
                with weightlift.safe_open(f, framework="pt", device=device) as s:
                    out.append(rows((k, s.get_tensor(k)) for k in s.keys()))
            return out

        def get_tensors():
            out = []
            for f in files:
                with weightlift.safe_open(f, framework="pt", device=device) as s:
                    out.append(rows(s.get_tensors().items()))
            return out

        run("safe_open.get_tensor", per_tensor)
        run("safe_open.get_tensors", get_tensors)
        run("pt_items_on_device", lambda: rows(_gpu.pt_items_on_device(pt, device)))
        run("pt_weights_iterator", lambda: rows(pt_weights_iterator([pt], False, {"cuda:1": device})))
        run("multi_thread_pt_weights_iterator", lambda: rows(multi_thread_pt_weights_iterator([pt], True, device)))
        run("pt/cpu", lambda: rows(pt_weights_iterator([pt], False, "cpu")))

        def dummy():
            # A device parameter stand-in (device memory of the fake), filled by
            # the engine's kernel, against the host fill of a CPU tensor.
            out = []
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                cpu = torch.empty(1001, dtype=dt)
                _params.initialize_single_dummy_weight(cpu, -0.5, 0.25, 99)
                n = cpu.numel() * cpu.element_size()
                ptr, buf = _core.gpu_empty(n, int(device.split(":")[1]) if ":" in device else 0)
                name = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}[dt]
                ok = _params.fill_dummy_on_device(name, ptr, cpu.numel(), int(device.split(":")[-1]) if ":" in device
                                                  else 0, -0.5, 0.25, 99)
                back = torch.utils.dlpack.from_dlpack(_core.gpu_copy_to_host(buf)).numpy().tobytes()
                out.append([name, ok, back == cpu.view(torch.uint8).numpy().tobytes()])
            return out

        run("dummy", dummy)
    result["costs"] = _core.gpu_process_costs()
    json.dump(result, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
