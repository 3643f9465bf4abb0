"""Distributed loading across processes on localhost: 2 and 4 ranks over
torch.distributed (gloo, spawned processes running dist_worker.py) and over
MPI (`mpirun --oversubscribe weightlift load --distributed`).

Every rank's tensors must be byte-identical to the checkpoint as the
`safetensors` package reads it (sharded ranks: torch.chunk of it); the bytes
read from storage across all ranks must be the checkpoint's once (the
engine's counters exactly, /proc/self/io within page and readahead slack, on
a cold cache); and one rank failing must fail every rank with its message,
within a bounded time. Each group runs several scenarios in a row: a clean
failure leaves the group usable.
"""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import CLI
from dist_worker import drop_cache, sha

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "dist_worker.py"
SHARD_RULES = ["*.q_proj.weight:0", "*.o_proj.weight:1", "model.embed_tokens.weight:0"]
PAGE = 4096


def write_model(folder: pathlib.Path, hidden=512, seed=0):
    """Three shards of unequal sizes: shardable projections, four experts, a
    norm, a bf16 head, a scalar and an empty tensor (about 3.5 MB)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, dt=torch.float32: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    folder.mkdir(parents=True, exist_ok=True)
    shards = [
        {"model.embed_tokens.weight": r(256, hidden), "model.norm.weight": r(hidden)},
        {"model.layers.0.self_attn.q_proj.weight": r(hidden, hidden),
         "model.layers.0.self_attn.o_proj.weight": r(hidden, hidden, dt=torch.float16),
         **{f"model.layers.0.mlp.experts.{e}.up_proj.weight": r(128, hidden) for e in range(4)}},
        {"lm_head.weight": r(256, hidden, dt=torch.bfloat16), "scale": r(()), "empty": r(0, 4)},
    ]
    files = []
    for i, s in enumerate(shards):
        p = folder / f"model-{i + 1:05d}-of-00003.safetensors"
        save_file(s, str(p))
        files.append(str(p))
    return files


def reference(files, rank=0, world=1, shard_rules=(), experts=None):
    """name -> [sha, dtype, shape] as rank `rank` of `world` should hold it."""
    rules = [(re.compile("^" + re.escape(p).replace(r"\*", ".*") + "$"), int(d))
             for p, d in (r.rsplit(":", 1) for r in shard_rules)]
    out = {}
    for f in files:
        for name, t in load_file(f).items():
            m = re.search(r"\.experts\.(\d+)\.", name)
            if experts is not None and m and name.endswith(".weight") and int(m.group(1)) not in experts:
                continue
            for pat, dim in rules:
                if pat.match(name):
                    t = torch.chunk(t, world, dim)[rank]
                    break
            out[name] = [sha(t), str(t.dtype), list(t.shape)]
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    files = write_model(root / "model")
    os.sync()
    tensor_bytes = sum(t.numel() * t.element_size() for f in files for t in load_file(f).values())
    file_bytes = sum(os.path.getsize(f) for f in files)
    return {"root": root, "files": files, "tensor_bytes": tensor_bytes, "file_bytes": file_bytes}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(tmp, world, scenarios, timeout=120, expect_killed=()):
    spec = tmp / f"spec{world}.json"
    spec.write_text(json.dumps({"scenarios": scenarios, "timeout": 30}))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), str(spec),
                               str(tmp / f"out{world}_{r}.json")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outs = []
    try:
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=timeout)
            if r in expect_killed:
                assert p.returncode == -9, out
                outs.append(None)
                continue
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out}"
            outs.append(json.load(open(tmp / f"out{world}_{r}.json")))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def check_read_once(results, model, direct, spread=True):
    """The engine read the tensors once in total; the processes' storage reads agree."""
    engine = sum(r["bytes_read"] for r in results)
    storage = sum(r["storage"] for r in results)
    world = len(results)
    if direct:
        # O_DIRECT reads whole pages: each read (one per 256 KiB chunk, file or slice) may add one on each side.
        reads = model["tensor_bytes"] // (256 * 1024) + 3 * world + 3
        assert model["tensor_bytes"] <= engine <= model["tensor_bytes"] + 2 * PAGE * reads, engine
        # The kernel counts the same reads, plus the headers the ranks parse.
        assert engine <= storage <= engine + world * 128 * 1024, (storage, engine)
    else:
        assert engine == model["tensor_bytes"]
        # The kernel's count: cold pages really came from storage. Through one shared page cache
        # each page is read once unless memory pressure evicts it between the ranks' touches (a
        # busy machine), so only "not every rank everything" is certain; O_DIRECT is exact.
        assert model["tensor_bytes"] * 0.98 <= storage < world * model["file_bytes"], (storage, engine)
    # ... spread over the ranks, not read by each. Exact only for O_DIRECT: buffered reads read
    # ahead into the next rank's slice (and dim-1 shards interleave within pages), and a page
    # is read by whichever rank touches it first.
    assert not (spread and direct) or max(r["storage"] for r in results) < model["file_bytes"] * (1.5 / world + 0.1)


def test_gloo_two_ranks(model, tmp_path):
    files = model["files"]
    other = write_model(tmp_path / "other", hidden=256)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json here}")
    engine = {"block_size": 16384, "threads": 2}
    scenarios = [
        {"name": "replica", "files": files, "cold": True, "drop": files, "engine": dict(engine, direct="off")},
        {"name": "replica-direct", "files": files, "cold": True, "drop": files,
         "engine": dict(engine, direct="on", block_size=256 * 1024)},
        {"name": "shard", "files": files, "cold": True, "drop": files, "shard_rules": SHARD_RULES,
         "engine": dict(engine, direct="off")},
        {"name": "experts", "files": files, "experts": [[0, 2], [1, 2]], "engine": engine},
        {"name": "mismatch", "per_rank": True, "files": [files, [other[0], files[1], files[2]]], "engine": engine},
        {"name": "bad-file", "per_rank": True, "files": [files, [files[0], str(bad), files[2]]], "engine": engine},
        {"name": "missing", "per_rank": True, "files": [files, [files[0], str(tmp_path / "gone.safetensors"),
                                                               files[2]]], "engine": engine},
        {"name": "after-failures", "files": files, "engine": engine},
    ]
    r0, r1 = run_gloo(tmp_path, 2, scenarios)
    by = lambda res: {x["name"]: x for x in res}  # noqa: E731
    r0, r1 = by(r0), by(r1)
    full = reference(files)
    for name in ("replica", "replica-direct", "after-failures"):
        for r in (r0, r1):
            assert r[name]["ok"], r[name]
            assert r[name]["tensors"] == full, name
    check_read_once([r0["replica"], r1["replica"]], model, direct=False)
    check_read_once([r0["replica-direct"], r1["replica-direct"]], model, direct=True)
    for rank, r in enumerate((r0, r1)):
        assert r["shard"]["tensors"] == reference(files, rank, 2, SHARD_RULES)
        assert r["experts"]["tensors"] == reference(files, experts={rank, 2})
    check_read_once([r0["shard"], r1["shard"]], model, direct=False, spread=False)
    # Expert 3 is nobody's: never read.
    assert r0["experts"]["bytes_read"] + r1["experts"]["bytes_read"] == model["tensor_bytes"] - 128 * 512 * 4

    for r in (r0, r1):
        assert not r["mismatch"]["ok"]
        assert "ranks disagree on the checkpoint: file 1 of 3" in r["mismatch"]["error"], r["mismatch"]["error"]
    assert "CorruptDataError" in r1["bad-file"]["error"] and "bad.safetensors" in r1["bad-file"]["error"]
    assert "rank 1 of 2 failed before the exchange" in r0["bad-file"]["error"], r0["bad-file"]["error"]
    assert "bad.safetensors" in r0["bad-file"]["error"]
    assert r1["missing"]["error"].startswith("FileNotFoundError") and "gone.safetensors" in r1["missing"]["error"]
    assert "rank 1 of 2 failed before the exchange" in r0["missing"]["error"]
    assert "gone.safetensors" in r0["missing"]["error"]


def test_gloo_reference_entry_points_spread_the_reads(model, tmp_path):
    """The reference's iterators, asked to (a keyword, is_distributed, or
    WEIGHTLIFT_DISTRIBUTED=1), read the checkpoint once across the ranks."""
    files = model["files"]
    entries = ["safetensors", "multi_thread", "runai", "env", "single"]
    scenarios = [{"name": e, "entry": e, "files": files, "cold": True, "drop": files} for e in entries]
    r0, r1 = run_gloo(tmp_path, 2, scenarios)
    by = lambda res: {x["name"]: x for x in res}  # noqa: E731
    r0, r1 = by(r0), by(r1)
    full = reference(files)
    for e in entries:
        for r in (r0, r1):
            assert r[e]["ok"], r[e]
            assert r[e]["tensors"] == full, e
    for e in entries[:-1]:
        # Through the distributed loader: the engine read every tensor once across the ranks.
        assert r0[e]["bytes_read"] is not None, e
        check_read_once([r0[e], r1[e]], model, direct=r0[e]["direct_io"])
    # The control, not asked: each rank loads by itself (no distributed loader ran).
    assert r0["single"]["bytes_read"] is None and r1["single"]["bytes_read"] is None


def test_gloo_four_ranks(model, tmp_path):
    files = model["files"]
    engine = {"block_size": 16384, "threads": 1, "direct": "off"}
    scenarios = [
        {"name": "replica", "files": files, "cold": True, "drop": files, "engine": engine},
        {"name": "shard", "files": files, "cold": True, "drop": files, "shard_rules": SHARD_RULES, "engine": engine},
    ]
    res = run_gloo(tmp_path, 4, scenarios)
    full = reference(files)
    for rank, r in enumerate(res):
        assert r[0]["ok"] and r[0]["tensors"] == full, r[0].get("error")
        assert r[1]["ok"] and r[1]["tensors"] == reference(files, rank, 4, SHARD_RULES), r[1].get("error")
    check_read_once([r[0] for r in res], model, direct=False)
    check_read_once([r[1] for r in res], model, direct=False, spread=False)
    # With shard rules only the replicated tensors move (the shards are read by their owners):
    # each rank receives the other ranks' slices of them, in blocks of at most 64 KiB + a 64-byte trailer.
    replicated = model["tensor_bytes"] - sum(
        t.numel() * t.element_size() for f in files for n, t in load_file(f).items()
        if n.endswith(("q_proj.weight", "o_proj.weight")) or n == "model.embed_tokens.weight")
    for r in res:
        assert r[0]["bytes_exchanged"] >= model["tensor_bytes"] * 3 // 4 - 4
        assert 0 < r[1]["bytes_exchanged"] <= replicated * 3 // 4 + 4 * (64 * 1024 + 64)
        assert r[1]["bytes_exchanged"] < r[0]["bytes_exchanged"] / 2


def test_gloo_killed_rank_fails_the_others_quickly(model, tmp_path):
    scenarios = [{"name": "killed", "files": model["files"], "kill_rank": 1, "max_queued_bytes": 1,
                  "barrier": False, "engine": {"block_size": 4096, "threads": 1, "direct": "off"}}]
    t0 = time.monotonic()
    (r0, _) = run_gloo(tmp_path, 2, scenarios, expect_killed=(1,))
    assert not r0[0]["ok"]
    assert "torch.distributed" in r0[0]["error"] and "rank 0 of 2" in r0[0]["error"], r0[0]["error"]
    assert time.monotonic() - t0 < 60


# ---- MPI: the CLI under mpirun ------------------------------------------------------

MPIRUN = shutil.which("mpirun")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="no mpirun (scripts/setup installs openmpi-bin)")


def mpirun(np, args, tmp, timeout=120, wrapper=None):
    """Runs `weightlift load ARGS --distributed` on np ranks; returns (rc, output, per-rank stdout, stderr)."""
    outdir = tmp / f"mpi{np}_{time.monotonic_ns()}"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    cmd = [MPIRUN, "--oversubscribe", "-np", str(np), "--output-filename", str(outdir)]
    cmd += (wrapper or []) + [CLI, "load", *map(str, args), "--distributed", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    ranks = []
    for r in range(np):
        d = outdir / "1" / f"rank.{r}"
        read = lambda n, d=d: (d / n).read_text() if (d / n).exists() else ""  # noqa: E731
        ranks.append((read("stdout"), read("stderr")))
    return p.returncode, p.stdout + p.stderr, ranks


def summary(err):
    m = re.search(r"loaded (\d+) tensors, (\d+) bytes .* read (\d+) bytes, .* storage read (\d+) bytes", err)
    assert m, err
    return {"tensors": int(m.group(1)), "bytes_read": int(m.group(3)), "storage": int(m.group(4))}


@needs_mpi
@pytest.mark.parametrize("np", [2, 4])
def test_mpi_ranks_match_a_single_process_load(model, tmp_path, np):
    folder = pathlib.Path(model["files"][0]).parent
    single = subprocess.run([CLI, "load", folder, "--checksum", "--format", "jsonl", "--no-progress"],
                            capture_output=True, text=True, check=True).stdout
    drop_cache(model["files"])
    rc, out, ranks = mpirun(np, [folder, "--checksum", "--format", "jsonl", "--block-size", "256KiB", "--direct", "on"],
                            tmp_path)
    assert rc == 0, out
    for stdout, _ in ranks:
        assert stdout == single
    stats = [summary(err) for _, err in ranks]
    check_read_once(stats, model, direct=True)
    # Buffered: the engine reads exactly the tensors' bytes once in total.
    rc, out, ranks = mpirun(np, [folder, "--block-size", "16KiB", "--direct", "off"], tmp_path)
    assert rc == 0, out
    assert sum(summary(err)["bytes_read"] for _, err in ranks) == model["tensor_bytes"]
    # Shard rules: each rank's tensors are its shard.
    rules = [a for r in SHARD_RULES for a in ("--shard-rule", r)]
    rc, out, ranks = mpirun(np, [folder, "--checksum", "--format", "jsonl", *rules], tmp_path)
    assert rc == 0, out
    for rank, (stdout, _) in enumerate(ranks):
        rows = {j["name"]: j for j in map(json.loads, stdout.splitlines())}
        ref = reference(model["files"], rank, np, SHARD_RULES)
        assert {n: [j["sha256"], j["shape"]] for n, j in rows.items()} == {n: [v[0], v[2]] for n, v in ref.items()}


@needs_mpi
def test_mpi_failures_fail_every_rank(model, tmp_path):
    folder = pathlib.Path(model["files"][0]).parent
    # A missing shard on rank 1: its folder lacks one file the index names.
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    os.remove(partial / "model-00002-of-00003.safetensors")
    pick = tmp_path / "pick.sh"  # rank 1 loads $ALT instead of the folder given
    pick.write_text('#!/bin/sh\nexe=$1; shift; shift; shift\n'
                    'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$exe" load "$ALT" "$@"; fi\n'
                    'exec "$exe" load "$DEFAULT" "$@"\n')
    pick.chmod(0o755)

    def with_alt(alt, *args, np=2):
        os.environ["ALT"], os.environ["DEFAULT"] = str(alt), str(folder)
        try:
            return mpirun(np, [folder, *args], tmp_path, wrapper=[str(pick)])
        finally:
            del os.environ["ALT"], os.environ["DEFAULT"]

    rc, out, ranks = with_alt(partial)
    assert rc != 0
    for _, err in ranks:
        assert "rank 1 has 2 files, rank 0 has 3 (rank 1 lacks 'model-00002-of-00003.safetensors')" in err, err
    # Mismatched checkpoints.
    other = tmp_path / "other"
    write_model(other, hidden=256)
    rc, out, ranks = with_alt(other)
    assert rc != 0
    for _, err in ranks:
        assert "ranks disagree on the checkpoint" in err, err
    # A killed rank: mpirun ends the job.
    killer = tmp_path / "kill.sh"
    killer.write_text('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then kill -9 $$; fi\nexec "$@"\n')
    killer.chmod(0o755)
    t0 = time.monotonic()
    rc, out, _ = mpirun(2, [folder], tmp_path, wrapper=[str(killer)])
    assert rc != 0
    # mpirun names the signal, or (when rank 0 noticed first and exited) the non-zero exit.
    assert "signal 9" in out or "non-zero exit code" in out, out
    assert time.monotonic() - t0 < 60
    # A rank that hangs (its weight file is on a server that accepts and never answers; a FIFO is
    # refused at once now): the others time out and abort the job.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        hung = "http://127.0.0.1:%d/model.safetensors" % silent.getsockname()[1]
        t0 = time.monotonic()
        rc, out, ranks = with_alt(hung, "--dist-timeout", "3")
    assert rc != 0
    assert "did not answer within 3000 ms" in ranks[0][1], ranks[0][1]
    assert "aborting the MPI job" in ranks[0][1]
    assert time.monotonic() - t0 < 60
