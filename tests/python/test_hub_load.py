"""Loading while downloading: `weightlift load REPO` on a cold cache (and the
Python iterator) fetch each blob once, by ranged parallel GETs that fill the
cache and the tensors in one pass; the cache ends as a plain download leaves
it; a wrong ETag fails the load naming the file; dropped connections resume
without re-reading; a killed load resumes as a download."""
import hashlib
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from hub_fixtures import CLI, HubServer, check_cache_clean, run_cli, write_repo

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def shard(seed, n):
    rng = np.random.default_rng(seed)
    tensors = {f"layer{seed}.w{i}": rng.standard_normal((256, 512), dtype=np.float32) for i in range(n)}
    return tensors, safetensors_numpy.save(tensors)


T1, S1 = shard(1, 6)  # 3 MiB each
T2, S2 = shard(2, 6)
INDEX = json.dumps({"weight_map": {**{k: "model-00001-of-00002.safetensors" for k in T1},
                                   **{k: "model-00002-of-00002.safetensors" for k in T2}}}).encode()
FILES = {"config.json": b'{"hidden": 8}', "model-00001-of-00002.safetensors": S1,
         "model-00002-of-00002.safetensors": S2, "model.safetensors.index.json": INDEX,
         "consolidated.safetensors": shard(3, 2)[1]}  # not named by the index: never fetched


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "repos"
    write_repo(root, "org/m", "main", FILES)
    s = HubServer(str(root)).start()
    yield s
    s.stop()


def load(server, cache, *extra, env=None):
    e = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(cache)}
    e.update(env or {})
    return run_cli(["load", "org/m", "--checksum", "--format", "jsonl", "--no-progress", *extra], e)


def expected_checksums():
    rows = {}
    for t in (T1, T2):
        for k, v in t.items():
            rows[k] = hashlib.sha256(v.tobytes()).hexdigest()
    return rows


def checksums(stdout):
    return {j["name"]: j["sha256"] for j in map(json.loads, stdout.splitlines())}


def listing(cache):
    out = []
    for d, dirs, names in os.walk(cache):
        if ".locks" in d:
            continue
        for n in dirs + names:
            p = os.path.join(d, n)
            out.append((os.path.relpath(p, cache), os.readlink(p) if os.path.islink(p) else None))
    return sorted(out)


def test_cold_load_fetches_each_byte_once_and_leaves_the_cache_a_download_leaves(server, tmp_path):
    server.set_rate(8 << 20)  # 8 MiB/s per connection: the load overlaps the transfer
    server.reset_stats()
    r = load(server, tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert checksums(r.stdout) == expected_checksums()
    served = server.stats()["bytes"]
    assert served.get("model-00001-of-00002.safetensors") == len(S1)  # each byte once
    assert served.get("model-00002-of-00002.safetensors") == len(S2)
    assert "consolidated.safetensors" not in served
    check_cache_clean(tmp_path / "c")
    # The same cache as `weightlift load` after a plain download (weights, index, configs).
    server.set_rate(0)
    r2 = run_cli(["download", "org/m", "--cache-dir", str(tmp_path / "d"), "-q", "--exclude", "consolidated*"],
                 {"HF_ENDPOINT": server.endpoint})
    assert r2.returncode == 0, r2.stderr
    assert listing(tmp_path / "c") == listing(tmp_path / "d")
    # And a warm load reads it from the cache without the network.
    r3 = load(server, tmp_path / "c", "--offline")
    assert r3.returncode == 0, r3.stderr
    assert checksums(r3.stdout) == expected_checksums()


def test_a_wrong_etag_fails_the_load_naming_the_file(server, tmp_path):
    server.set_fault("corrupt", count=1000, path="model-00002-of-00002")
    r = load(server, tmp_path / "c")
    assert r.returncode == 1
    assert "model-00002-of-00002.safetensors in org/m (revision main) do not match the ETag" in r.stderr, r.stderr
    blobs = tmp_path / "c" / "models--org--m" / "blobs"
    assert not (blobs / hashlib.sha256(S2).hexdigest()).exists()
    check_cache_clean(tmp_path / "c")


def test_dropped_connections_resume_without_rereading(server, tmp_path):
    server.set_fault("reset", count=3, path="model-0000")
    server.reset_stats()
    r = load(server, tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert checksums(r.stdout) == expected_checksums()
    served = server.stats()["bytes"]
    total = served["model-00001-of-00002.safetensors"] + served["model-00002-of-00002.safetensors"]
    assert total < 1.3 * (len(S1) + len(S2)), served  # resumed ranges, not whole files again
    check_cache_clean(tmp_path / "c")


def test_a_killed_load_resumes_as_a_download(server, tmp_path):
    cache = tmp_path / "c"
    # One ranged GET of the first shard crawls; the others arrive and are journalled meanwhile.
    server.set_fault("slow", count=1, path="model-00001-of-00002.safetensors")
    env = dict(os.environ, HF_ENDPOINT=server.endpoint, HF_HUB_CACHE=str(cache))
    p = subprocess.Popen([CLI, "load", "org/m", "--no-progress", "--block-size", "1MiB"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blobs = cache / "models--org--m" / "blobs"
    journal = None
    for _ in range(600):  # bounded: 60 s
        time.sleep(0.1)
        if p.poll() is not None:
            break
        if blobs.exists():
            for n in os.listdir(blobs):
                if n.endswith(".incomplete.ranges"):
                    try:
                        lines = open(blobs / n).read().splitlines()[2:]
                    except FileNotFoundError:
                        continue
                    # A MiB journalled as arrived: enough that resuming must save bytes.
                    if sum(int(b) - int(a) for a, b in (ln.split() for ln in lines if ln.count(" ") == 1)) >= 1 << 20:
                        journal = n
        if journal:
            break
    assert journal, f"no journalled range appeared (exit {p.poll()})"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    time.sleep(1)
    check_cache_clean(cache)
    server.set_fault("none")
    server.reset_stats()
    r = run_cli(["download", "org/m", "--cache-dir", str(cache), "-q", "--exclude", "consolidated*"],
                {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    served = server.stats()["bytes"]
    assert sum(served.get(f, 0) for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")) \
        < len(S1) + len(S2)
    check_cache_clean(cache)
    assert not [n for n in os.listdir(blobs) if "." in n]


def test_a_journal_of_ranges_anywhere_saves_its_bytes_whatever_the_chunk_size(server, tmp_path):
    # What a killed load can leave: the first MiB still crawling, the rest arrived and journalled.
    # The resuming download cuts its chunks at the journal's ranges, so only the first MiB is served.
    cache = tmp_path / "c"
    blobs = cache / "models--org--m" / "blobs"
    blobs.mkdir(parents=True)
    etag = hashlib.sha256(S1).hexdigest()
    partial = blobs / f"{etag}.0badc0de.incomplete"
    partial.write_bytes(bytes(1 << 20) + S1[1 << 20:])
    (blobs / (partial.name + ".ranges")).write_text(f"weightlift-ranges 1\n{etag} {len(S1)}\n{1 << 20} {len(S1)}\n")
    server.reset_stats()
    r = run_cli(["download", "org/m", "--cache-dir", str(cache), "-q", "--exclude", "consolidated*"],
                {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    served = server.stats()["bytes"]
    assert served.get("model-00001-of-00002.safetensors", 0) == 1 << 20, served
    assert (blobs / etag).read_bytes() == S1
    check_cache_clean(cache)


def _python(code, env, timeout=120):
    import sys
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=timeout)


def test_a_process_that_exits_while_its_download_runs_ends_cleanly(server, tmp_path):
    # download_weights_from_hf(load_while_downloading=True) returns at once; a process that ends then
    # waits for the blobs (its finishing thread never meets the interpreter's teardown) and exits 0.
    pytest.importorskip("weightlift")
    env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "c")}
    code = ("import weightlift as wl\n"
            "print(wl.download_weights_from_hf('org/m', None, ['*.safetensors'], load_while_downloading=True))\n")
    for _ in range(3):
        r = _python(code, env)
        assert r.returncode == 0, r.stderr
    blobs = tmp_path / "c" / "models--org--m" / "blobs"
    for b in (S1, S2):  # both shards final, nothing partial left
        assert (blobs / hashlib.sha256(b).hexdigest()).read_bytes() == b
    assert not [n for n in os.listdir(blobs) if "." in n]
    check_cache_clean(tmp_path / "c")


def test_python_iterator_and_download_opt_in(server, tmp_path):
    pytest.importorskip("weightlift")
    env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "c")}
    code = (
        "import hashlib, json, weightlift as wl\n"
        "got = {n: hashlib.sha256(t.numpy().tobytes()).hexdigest() for n, t in wl.hub_weights_iterator('org/m')}\n"
        "print(json.dumps(got))\n")
    r = _python(code, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == expected_checksums()
    # download_weights_from_hf(load_while_downloading=True): the folder at once, its files readable as they arrive.
    env["HF_HUB_CACHE"] = str(tmp_path / "c2")
    code = (
        "import glob, hashlib, json, os, weightlift as wl\n"
        "folder = wl.download_weights_from_hf('org/m', None, ['*.safetensors'], load_while_downloading=True)\n"
        "got = {n: hashlib.sha256(t.numpy().tobytes()).hexdigest() for n, t in wl.stream_weights(folder, 'stream')}\n"
        "print(json.dumps(got))\n")
    r = _python(code, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == expected_checksums()
    # A blob that does not verify: the iterator raises at its end, naming the file.
    server.set_fault("corrupt", count=1000, path="model-00001-of-00002")
    env["HF_HUB_CACHE"] = str(tmp_path / "c3")
    r = _python("import weightlift as wl\nfor _ in wl.hub_weights_iterator('org/m'): pass\n", env)
    assert r.returncode != 0
    assert "CorruptDataError" in r.stderr and "model-00001-of-00002.safetensors in org/m" in r.stderr, r.stderr


def test_tensors_loaded_while_downloading_are_views_of_the_cache_not_copies(server, tmp_path):
    """No second copy: each tensor the iterator yields (strategy None) lies in
    a mapping of the cache's blob file, bytes equal to the checkpoint's; with
    strategy="stream" it is new memory. The CLI picks the same view path."""
    pytest.importorskip("weightlift")
    server.set_rate(8 << 20)
    env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "c")}
    code = (
        "import hashlib, json, sys, weightlift as wl\n"
        "def where(ptr):\n"
        "    for line in open('/proc/self/maps'):\n"
        "        parts = line.split(maxsplit=5)\n"
        "        a, b = (int(x, 16) for x in parts[0].split('-'))\n"
        "        if a <= ptr < b:\n"
        "            return parts[5].strip() if len(parts) > 5 else ''\n"
        "    return ''\n"
        "out = {}\n"
        "for strategy in (None, 'stream'):\n"
        "    kw = {} if strategy is None else {'strategy': strategy}\n"
        "    rows = {}\n"
        "    for n, t in wl.hub_weights_iterator('org/m', cache_dir=sys.argv[1] + (strategy or ''), **kw):\n"
        "        rows[n] = [hashlib.sha256(t.numpy().tobytes()).hexdigest(), where(t.data_ptr())]\n"
        "    out[str(strategy)] = rows\n"
        "print(json.dumps(out))\n")
    import sys
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True,
                       env=dict(os.environ, **env), timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = expected_checksums()
    assert {n: v[0] for n, v in out["None"].items()} == want
    assert {n: v[0] for n, v in out["stream"].items()} == want
    for n, (_, mapped) in out["None"].items():
        assert "/models--org--m/blobs/" in mapped, (n, mapped)
    for n, (_, mapped) in out["stream"].items():
        assert "/blobs/" not in mapped, (n, mapped)
    check_cache_clean(tmp_path / "c")
    r = run_cli(["load", "org/m", "--no-progress"],
                {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "d")})
    assert r.returncode == 0, r.stderr
    assert "strategy lazy" in r.stderr, r.stderr


def test_enable_xet_high_performance_and_maybe_download_from_modelscope(server, tmp_path):
    pytest.importorskip("weightlift")
    from hub_fixtures import HF_RELEASES, hf_release_available
    code = ("import huggingface_hub.constants as c, weightlift as wl\n"
            "c.HF_XET_HIGH_PERFORMANCE = False\n"
            "wl.enable_xet_high_performance()\n"
            "print(c.HF_XET_HIGH_PERFORMANCE)\n")
    for release in [r for r in HF_RELEASES if hf_release_available(r)]:
        env = dict(HF_RELEASES[release])
        env.pop("HF_XET_HIGH_PERFORMANCE", None)
        r = _python(code, env)
        assert r.returncode == 0 and r.stdout.strip() == "True", (release, r.stderr)
        r = _python(code, dict(env, HF_XET_HIGH_PERFORMANCE="0"))  # the user's setting wins
        assert r.returncode == 0 and r.stdout.strip() == "False", (release, r.stderr)
    code = ("import weightlift as wl\n"
            f"print(wl.maybe_download_from_modelscope('org/m', download_dir={str(tmp_path / 'ms')!r},"
            " allow_patterns=['*.json']))\n")
    r = _python(code, {"VLLM_USE_MODELSCOPE": "", "MODELSCOPE_DOMAIN": server.endpoint})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr
    r = _python(code, {"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_DOMAIN": server.endpoint})
    assert r.returncode == 0, r.stderr
    folder = r.stdout.strip()
    assert folder == str(tmp_path / "ms" / "models" / "org--m" / "snapshots" / "master")
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors.index.json"]
