"""One vLLM engine start in a process of its own: loads MODEL with a load
format, generates greedily from token-id prompts, writes a JSON result.

    python llm_run.py '{"model": DIR, "load_format": "weightlift", "tp": 1, "out": PATH, ...}'

Used by tests/vllm/ and bench/vllm/. Result: token ids and top-k logprobs
per prompt, vLLM's own "Loading weights took" and "Model loading took"
figures, the whole LLM() construction time, the process's peak RSS, and
(load format weightlift) each rank's loader statistics. With "after":
steps run once generation is done, through the worker extension
wl_worker_ext.py, each step's result kept in "after" (["hashes"],
["reload", PATH], ["filtered", PATH, MODULE], ["generate"]: the prompts again).
"""
from __future__ import annotations

import json
import os
import re
import resource
import sys
import time


def main() -> None:
    args = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_CPU_CI_ENV", "1")  # no warm-up pass (seconds per start)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    for k, v in (args.get("env") or {}).items():
        os.environ[k] = str(v)
    if args.get("load_format") == "weightlift" and args.get("stats_dir"):
        os.environ["WEIGHTLIFT_VLLM_STATS_DIR"] = args["stats_dir"]

    from vllm import LLM, SamplingParams

    kw = dict(model=args["model"], load_format=args.get("load_format", "auto"),
              tensor_parallel_size=int(args.get("tp", 1)), skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=int(args.get("max_model_len", 256)), dtype=args.get("dtype", "bfloat16"),
              seed=0, kv_cache_memory_bytes=int(args.get("kv_cache_bytes", 128 << 20)))
    if args.get("extra"):
        kw["model_loader_extra_config"] = args["extra"]
    if args.get("safetensors_load_strategy"):
        kw["safetensors_load_strategy"] = args["safetensors_load_strategy"]
    if int(args.get("tp", 1)) > 1:
        kw["distributed_executor_backend"] = "mp"
    if args.get("after"):
        # The workers import the extension: this folder on their path.
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        sys.path.insert(0, here)
        kw["worker_extension_cls"] = "wl_worker_ext.WeightliftTestExtension"
    t0 = time.perf_counter()
    llm = LLM(**kw)
    construct = time.perf_counter() - t0
    out = {"construct_seconds": construct}
    if args.get("prompts"):
        out.update(generate(llm, SamplingParams, args))
    after = []
    for step in args.get("after") or []:
        if step[0] == "generate":
            after.append(generate(llm, SamplingParams, args))
            continue
        call = {"hashes": "wl_param_hashes", "reload": "wl_reload", "filtered": "wl_filtered"}[step[0]]
        after.append(llm.collective_rpc(call, args=tuple(step[1:]))[0])
    out["after"] = after
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["peak_rss_children_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    with open(args["out"], "w") as f:
        json.dump(out, f)
    # No teardown: vLLM's takes seconds (a 5 s grace period for its engine
    # core). The engine core and workers this process started are ended here.
    sys.stdout.flush()
    sys.stderr.flush()
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    os._exit(0)


def generate(llm, SamplingParams, args: dict) -> dict:
    """Greedy token ids and top-k logprobs of each prompt."""
    sp = SamplingParams(temperature=0.0, max_tokens=int(args.get("max_tokens", 8)),
                        logprobs=int(args.get("logprobs", 5)), ignore_eos=True, seed=0)
    # One prompt at a time: in vLLM's default mode the requests reach the
    # engine core over a socket, so two prompts given together may be
    # scheduled in one batch or in two depending on timing, and a CPU
    # GEMM's rounding depends on the batch's shape (logprobs then differ
    # in the last bits with identical weights).
    res = [llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0] for p in args["prompts"]]
    return {"tokens": [list(r.outputs[0].token_ids) for r in res],
            "logprobs": [[sorted((int(k), float(v.logprob)) for k, v in step.items())
                          for step in r.outputs[0].logprobs] for r in res]}


def parse_log(text: str) -> dict:
    """vLLM's own load figures from its log (the last of each)."""
    got = {}
    for key, pat in (("loading_weights_seconds", r"Loading weights took ([0-9.]+) seconds"),
                     ("model_loading_seconds", r"Model loading took [0-9.]+ [GM]i?B(?: memory)? and ([0-9.]+) seconds"),
                     ("model_loading_seconds", r"Model loading took ([0-9.]+) seconds")):
        m = re.findall(pat, text)
        if m and key not in got:
            got[key] = float(m[-1])
    return got


if __name__ == "__main__":
    main()
