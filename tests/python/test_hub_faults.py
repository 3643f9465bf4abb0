"""Fault modes, crashes, concurrency, path traversal and the token, against the
loopback Hub server. Every case ends with the right file or a clear error, and
never a corrupt or partial file under a final name in the cache."""
import hashlib
import os
import signal
import subprocess
import time

import pytest

from hub_fixtures import CLI, TOKEN, HubServer, check_cache_clean, det_bytes, run_cli, write_repo

BIG = det_bytes(6 << 20, 7)       # LFS, served through the CDN port
SMALL = det_bytes(300 << 10, 8)   # regular file (.txt), git-blob ETag, served by the hub port


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "repos"
    write_repo(root, "org/m", "main", {"big.safetensors": BIG, "small.txt": SMALL, "config.json": b"{}"})
    write_repo(root, "org/gated", "main", {"w.safetensors": det_bytes(2 << 20, 9), "a.txt": b"a"}, gated=True)
    write_repo(root, "org/evil", "main", {"ok.txt": b"ok"}, extra_names=["../../../escape.txt"])
    write_repo(root, "org/evil2", "main", {"ok.txt": b"ok"}, extra_names=["/etc/passwd_copy"])
    s = HubServer(str(root), token=TOKEN).start()
    yield s
    s.stop()


def dl(server, cache, *extra, env=None):
    e = {"HF_ENDPOINT": server.endpoint}
    e.update(env or {})
    return run_cli(["download", "org/m", "--cache-dir", str(cache), "-q", *extra], e)


def snapshot_ok(out):
    p = out.strip()
    assert open(os.path.join(p, "big.safetensors"), "rb").read() == BIG
    assert open(os.path.join(p, "small.txt"), "rb").read() == SMALL


SPLIT = ["--split-min", "2MB", "--chunk", "1MB", "--connections", "4"]


@pytest.mark.parametrize("split", [False, True], ids=["single", "ranged"])
@pytest.mark.parametrize("mode,count", [("reset", 2), ("truncate", 2), ("500", 3), ("429", 2), ("corrupt", 1)])
def test_transient_faults_recover(server, tmp_path, mode, count, split):
    server.set_fault(mode, count=count, retry_after=1 if mode == "429" else 0)
    r = dl(server, tmp_path / "c", *(SPLIT if split else []))
    assert r.returncode == 0, r.stderr
    snapshot_ok(r.stdout)
    check_cache_clean(tmp_path / "c")


@pytest.mark.parametrize("split", [False, True], ids=["single", "ranged"])
def test_persistent_wrong_etag_is_an_error_and_nothing_enters_the_cache(server, tmp_path, split):
    server.set_fault("corrupt", count=1000, path="big.safetensors")
    r = dl(server, tmp_path / "c", *(SPLIT if split else []))
    assert r.returncode == 1
    assert "do not match the ETag" in r.stderr
    blobs = tmp_path / "c" / "models--org--m" / "blobs"
    assert not (blobs / hashlib.sha256(BIG).hexdigest()).exists()
    check_cache_clean(tmp_path / "c")
    # The server heals: the next run succeeds.
    server.set_fault("none", 0)
    r = dl(server, tmp_path / "c", *(SPLIT if split else []))
    assert r.returncode == 0, r.stderr
    snapshot_ok(r.stdout)


def test_persistent_500_is_a_clear_error(server, tmp_path):
    server.set_fault("500", count=1000)
    r = dl(server, tmp_path / "c")
    assert r.returncode == 1
    assert "HTTP 500" in r.stderr
    check_cache_clean(tmp_path / "c")


@pytest.mark.parametrize("split", [False, True], ids=["single", "ranged"])
def test_kill_9_mid_download_then_resume(server, tmp_path, split):
    cache = tmp_path / "c"
    server.set_rate(128 << 10)  # 128 KiB/s per connection: the download takes 12-48 s
    env = dict(os.environ, HF_ENDPOINT=server.endpoint)
    p = subprocess.Popen([CLI, "download", "org/m", "--cache-dir", str(cache), "-q", *(SPLIT if split else [])],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blobs = cache / "models--org--m" / "blobs"
    partial = None
    for _ in range(900):  # bounded: up to 90 s
        time.sleep(0.1)
        if p.poll() is not None:  # finished or failed before we could interrupt it
            break
        if blobs.exists():
            for n in os.listdir(blobs):
                if not n.startswith(hashlib.sha256(BIG).hexdigest()):
                    continue
                # "{etag}.{8 hex}.incomplete" with a journal of arrived ranges beside it
                if n.endswith(".incomplete.ranges") and len(open(blobs / n).read().splitlines()) > 2:
                    partial = blobs / n
        if partial is not None and server.stats()["bytes"].get("big.safetensors", 0) > (1 << 20):
            break
    assert partial is not None, (
        f"no partial file appeared (exit {p.poll()}: {p.stderr.read() if p.poll() is not None else ''})")
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    time.sleep(1)  # let the server's throttled threads notice the closed connections
    check_cache_clean(cache)
    assert not (blobs / hashlib.sha256(BIG).hexdigest()).exists()
    served_before = server.stats()["bytes"].get("big.safetensors", 0)
    server.set_rate(0)
    server.reset_stats()
    r = dl(server, cache, *(SPLIT if split else []))
    assert r.returncode == 0, r.stderr
    snapshot_ok(r.stdout)
    resumed = server.stats()["bytes"].get("big.safetensors", 0)
    assert resumed < len(BIG), "the second run downloaded everything again"
    assert served_before + resumed >= len(BIG)
    check_cache_clean(cache)


@pytest.mark.parametrize("split", [False, True], ids=["single", "ranged"])
def test_four_processes_one_download(server, tmp_path, split):
    cache = tmp_path / "c"
    server.set_rate(8 << 20)
    env = dict(os.environ, HF_ENDPOINT=server.endpoint)
    procs = [subprocess.Popen([CLI, "download", "org/m", "--cache-dir", str(cache), "-q", *(SPLIT if split else [])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        snapshot_ok(out)
    assert len({o for o, _ in outs}) == 1
    stats = server.stats()
    assert stats["bytes"]["big.safetensors"] == len(BIG)  # downloaded once
    assert stats["bytes"]["small.txt"] == len(SMALL)
    check_cache_clean(cache)


@pytest.mark.parametrize("repo", ["org/evil", "org/evil2"])
def test_path_traversal_refused(server, tmp_path, repo):
    cache = tmp_path / "deep" / "c"
    r = run_cli(["download", repo, "--cache-dir", str(cache), "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 1
    assert "refusing repository file name" in r.stderr
    assert not (tmp_path / "escape.txt").exists()
    assert not list(tmp_path.rglob("escape.txt")) and not list(tmp_path.rglob("passwd_copy"))


def test_gated_repo_token_only_to_the_hub(server, tmp_path):
    cache = tmp_path / "c"
    env = {"HF_ENDPOINT": server.endpoint}
    r = run_cli(["download", "org/gated", "--cache-dir", str(cache)], env)
    assert r.returncode == 1 and "gated" in r.stderr
    server.reset_stats()
    r = run_cli(["download", "org/gated", "--cache-dir", str(cache), "--token", TOKEN], env)
    assert r.returncode == 0, r.stderr
    assert TOKEN not in r.stdout + r.stderr
    stats = server.stats()
    assert stats["bytes"].get("w.safetensors") == 2 << 20  # came from the CDN port
    assert stats["cdn_auth"] == []                          # without the token
    # HF_TOKEN and the token file work too, and a wrong token fails cleanly.
    r = run_cli(["download", "org/gated", "--cache-dir", str(tmp_path / "c2"), "-q"], dict(env, HF_TOKEN=TOKEN))
    assert r.returncode == 0, r.stderr
    home = tmp_path / "hfhome"
    home.mkdir()
    (home / "token").write_text(TOKEN + "\n")
    r = run_cli(["download", "org/gated", "--cache-dir", str(tmp_path / "c3"), "-q"], dict(env, HF_HOME=str(home)))
    assert r.returncode == 0, r.stderr
    r = run_cli(["download", "org/gated", "--cache-dir", str(tmp_path / "c4"), "--token", "hf_wrong"], env)
    assert r.returncode == 1 and "hf_wrong" not in r.stderr
    assert server.stats()["cdn_auth"] == []


def test_missing_repo_is_a_clear_error(server, tmp_path):
    r = run_cli(["download", "org/none", "--cache-dir", str(tmp_path)], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 1 and "repository not found" in r.stderr


def test_resumes_a_partial_file_left_by_huggingface_hub(server, tmp_path):
    # huggingface_hub 0.x leaves "{etag}.incomplete" holding a prefix; we continue it with Range.
    cache = tmp_path / "c"
    blobs = cache / "models--org--m" / "blobs"
    blobs.mkdir(parents=True)
    etag = hashlib.sha256(BIG).hexdigest()
    (blobs / (etag + ".incomplete")).write_bytes(BIG[: len(BIG) // 3])
    server.reset_stats()
    r = dl(server, cache)  # the split threshold (64MB) is above this file: single stream
    assert r.returncode == 0, r.stderr
    snapshot_ok(r.stdout)
    assert server.stats()["bytes"]["big.safetensors"] == len(BIG) - len(BIG) // 3
    assert not (blobs / (etag + ".incomplete")).exists()
    assert sorted(os.listdir(blobs)) == sorted([etag, hashlib.sha1(b"blob %d\0" % len(SMALL) + SMALL).hexdigest(),
                                                "9e26dfeeb6e641a33dae4961196235bdb965b21b"])  # no partial, no journal


@pytest.mark.parametrize("split", [False, True], ids=["single", "ranged"])
def test_wrong_etag_message_names_the_repository_file_and_revision(server, tmp_path, split):
    server.set_fault("corrupt", count=1000, path="big.safetensors")
    r = dl(server, tmp_path / "c", *(SPLIT if split else []))
    assert r.returncode == 1
    assert "big.safetensors in org/m (revision main) do not match the ETag" in r.stderr, r.stderr
    assert ".incomplete" not in r.stderr and "sig=" not in r.stderr and "/blobs/" not in r.stderr, r.stderr
