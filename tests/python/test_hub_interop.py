"""Interop with the real huggingface_hub (0.27.1) against the loopback Hub server:
ours downloads -> theirs finds it offline; theirs downloads -> ours finds it offline."""
import os
import subprocess
import sys

import pytest

from hub_fixtures import CLI, HubServer, check_cache_clean, det_bytes, run_cli, write_repo

pytest.importorskip("huggingface_hub")


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "repos"
    write_repo(root, "org/model", "main", {
        "config.json": b'{"hidden": 8}',
        "model-00001-of-00002.safetensors": det_bytes(3 << 20, 1),
        "model-00002-of-00002.safetensors": det_bytes(1 << 20, 2),
        "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00002.safetensors"}}',
        "sub/dir/notes.txt": b"hello\n",
    })
    write_repo(root, "org/model", "v1", {"config.json": b'{"hidden": 4}'})
    s = HubServer(str(root), token=None, page_size=3).start()
    yield s
    s.stop()


def tree(cache):
    out = []
    for dirpath, dirs, names in os.walk(cache):
        if ".locks" in dirpath:
            continue
        for n in sorted(dirs + names):
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, cache)
            out.append((rel, os.readlink(p) if os.path.islink(p) else None))
    return sorted(out)


def hf_python(code, env):
    e = dict(os.environ)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_ours_downloads_theirs_finds_offline(server, tmp_path):
    cache = str(tmp_path / "cache")
    r = run_cli(["download", "org/model", "--cache-dir", cache, "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    ours = r.stdout.strip()
    r2 = run_cli(["download", "org/model", "--revision", "v1", "--cache-dir", cache, "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r2.returncode == 0, r2.stderr
    check_cache_clean(cache)
    theirs = hf_python(
        "import huggingface_hub as h\n"
        f"p = h.snapshot_download('org/model', cache_dir={cache!r})\n"
        f"f = h.hf_hub_download('org/model', 'sub/dir/notes.txt', cache_dir={cache!r})\n"
        f"v = h.snapshot_download('org/model', revision='v1', cache_dir={cache!r})\n"
        "print(p); print(open(f).read().strip()); print(v)",
        {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    lines = theirs.splitlines()
    assert lines[0] == ours
    assert lines[1] == "hello"
    assert lines[2] == r2.stdout.strip()
    # Theirs online against the same cache downloads nothing new.
    server.reset_stats()
    hf_python(f"import huggingface_hub as h; h.snapshot_download('org/model', cache_dir={cache!r})",
              {"HF_ENDPOINT": server.endpoint})
    assert server.stats()["bytes"] == {}


def test_theirs_downloads_ours_finds_offline(server, tmp_path):
    cache_theirs = str(tmp_path / "theirs")
    cache_ours = str(tmp_path / "ours")
    theirs = hf_python(
        "import huggingface_hub as h\n"
        f"print(h.snapshot_download('org/model', cache_dir={cache_theirs!r}))",
        {"HF_ENDPOINT": server.endpoint})
    server.reset_stats()
    r = run_cli(["download", "org/model", "--cache-dir", cache_theirs, "--offline"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == theirs
    r = run_cli(["download", "org/model", "--cache-dir", cache_theirs],
                {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": server.endpoint})
    assert r.stdout.strip() == theirs
    assert server.stats()["requests"] == []  # offline never touches the network
    # And the layouts are identical, symlink targets included.
    r = run_cli(["download", "org/model", "--cache-dir", cache_ours, "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    assert tree(cache_ours) == tree(cache_theirs)


def test_offline_without_cache_is_a_clear_error(tmp_path):
    r = run_cli(["download", "org/model", "--cache-dir", str(tmp_path), "--offline"])
    assert r.returncode == 1
    assert "offline mode" in r.stderr


def test_revisions_tag_and_commit(server, tmp_path):
    cache = str(tmp_path / "c")
    env = {"HF_ENDPOINT": server.endpoint}
    r = run_cli(["download", "org/model", "--revision", "v1", "--cache-dir", cache, "-q"], env)
    assert r.returncode == 0, r.stderr
    commit = os.path.basename(r.stdout.strip())
    assert open(os.path.join(cache, "models--org--model", "refs", "v1")).read() == commit
    r = run_cli(["download", "org/model", "--revision", commit, "--cache-dir", cache, "-q", "--offline"])
    assert r.returncode == 0 and r.stdout.strip().endswith(commit)
    r = run_cli(["download", "org/model", "--revision", "nope", "--cache-dir", cache, "-q"], env)
    assert r.returncode == 1 and "revision not found" in r.stderr


def test_include_exclude_patterns_match_huggingface_hub(server, tmp_path):
    cache = str(tmp_path / "c")
    env = {"HF_ENDPOINT": server.endpoint}
    r = run_cli(["download", "org/model", "--include", "*.json", "--include", "sub/", "--exclude", "*index*",
                 "--cache-dir", cache, "-q"], env)
    assert r.returncode == 0, r.stderr
    ours = sorted(os.path.relpath(os.path.join(d, n), r.stdout.strip())
                  for d, _, ns in os.walk(r.stdout.strip()) for n in ns)
    theirs = hf_python(
        "import huggingface_hub as h, os\n"
        f"p = h.snapshot_download('org/model', cache_dir={str(tmp_path / 't')!r}, allow_patterns=['*.json', 'sub/'],"
        " ignore_patterns=['*index*'])\n"
        "print('\\n'.join(sorted(os.path.relpath(os.path.join(d, n), p) for d, _, ns in os.walk(p) for n in ns)))",
        {"HF_ENDPOINT": server.endpoint})
    assert ours == theirs.splitlines()
    assert ours == ["config.json", "sub/dir/notes.txt"]
