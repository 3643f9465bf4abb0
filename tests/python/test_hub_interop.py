"""Interop with the real huggingface_hub -- the pinned 0.27.1 and the current 2.x
release -- against the loopback Hub server: ours downloads -> theirs finds it
offline; theirs downloads -> ours finds it offline; the caches are the same
entry for entry (2.x's CACHEDIR.TAG and trees/{commit}.json included), also
after a failed download."""
import hashlib
import json
import os

import pytest

from hub_fixtures import (
    HubServer,
    check_cache_clean,
    det_bytes,
    hf_python,
    hf_release_available,
    run_cli,
    write_repo,
)


@pytest.fixture(params=["hf0.27", "hf2"])
def hf(request):
    if not hf_release_available(request.param):
        pytest.skip(request.param + " is not installed (scripts/setup installs both)")
    return request.param


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


def tree(cache, release="hf2"):
    """Every entry with its symlink target, and the bytes of the small metadata
    files (refs, tree listings, CACHEDIR.TAG). Against 0.27, which writes no
    CACHEDIR.TAG and no trees/, those are left out."""
    out = []
    for dirpath, dirs, names in os.walk(cache):
        if ".locks" in dirpath:
            continue
        for n in sorted(dirs + names):
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, cache)
            if release == "hf0.27" and (rel == "CACHEDIR.TAG" or "/trees" in "/" + rel):
                continue
            content = None
            if os.path.isfile(p) and not os.path.islink(p) and "/blobs/" not in p:
                content = open(p, "rb").read()
            out.append((rel, os.readlink(p) if os.path.islink(p) else None, content))
    return sorted(out)


def test_ours_downloads_theirs_finds_offline(server, tmp_path, hf):
    cache = str(tmp_path / "cache")
    r = run_cli(["download", "org/model", "--cache-dir", cache, "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    ours = r.stdout.strip()
    r2 = run_cli(["download", "org/model", "--revision", "v1", "--cache-dir", cache, "-q"],
                 {"HF_ENDPOINT": server.endpoint})
    assert r2.returncode == 0, r2.stderr
    check_cache_clean(cache)
    theirs = hf_python(
        "import huggingface_hub as h\n"
        f"p = h.snapshot_download('org/model', cache_dir={cache!r})\n"
        f"f = h.hf_hub_download('org/model', 'sub/dir/notes.txt', cache_dir={cache!r})\n"
        f"v = h.snapshot_download('org/model', revision='v1', cache_dir={cache!r})\n"
        "print(p); print(open(f).read().strip()); print(v)",
        {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}, hf)
    lines = theirs.splitlines()
    assert lines[0] == ours
    assert lines[1] == "hello"
    assert lines[2] == r2.stdout.strip()
    # Theirs online against the same cache downloads nothing new.
    server.reset_stats()
    hf_python(f"import huggingface_hub as h; h.snapshot_download('org/model', cache_dir={cache!r})",
              {"HF_ENDPOINT": server.endpoint}, hf)
    assert server.stats()["bytes"] == {}


def test_theirs_downloads_ours_finds_offline(server, tmp_path, hf):
    cache_theirs = str(tmp_path / "theirs")
    cache_ours = str(tmp_path / "ours")
    theirs = hf_python(
        "import huggingface_hub as h\n"
        f"print(h.snapshot_download('org/model', cache_dir={cache_theirs!r}))",
        {"HF_ENDPOINT": server.endpoint}, hf)
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
    assert tree(cache_ours, hf) == tree(cache_theirs, hf)


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
    # The repository and the revision are in the message itself, not only inside a URL.
    msg = r.stderr.split(" (HTTP")[0]
    assert "'nope'" in msg and "org/model" in msg, r.stderr


def test_include_exclude_patterns_match_huggingface_hub(server, tmp_path, hf):
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
        {"HF_ENDPOINT": server.endpoint}, hf)
    assert ours == theirs.splitlines()
    assert ours == ["config.json", "sub/dir/notes.txt"]


def test_patterns_matching_nothing_warn_as_huggingface_hub_does(server, tmp_path, hf):
    env = {"HF_ENDPOINT": server.endpoint}
    r = run_cli(["download", "org/model", "--include", "*.gguf", "--cache-dir", str(tmp_path / "c"), "-q"], env)
    assert r.returncode == 0, r.stderr  # huggingface_hub returns the (empty) folder too
    assert "No files matched allow_patterns=['*.gguf']" in r.stderr
    if hf == "hf2":
        theirs = hf_python(
            "import huggingface_hub as h\n"
            f"h.snapshot_download('org/model', cache_dir={str(tmp_path / 't')!r}, allow_patterns=['*.gguf'])",
            env, hf, check=False)
        assert "No files matched allow_patterns=['*.gguf']" in theirs.stderr


def test_tree_listing_follows_every_page(server, tmp_path):
    # Page size 3 over 5 files and 2 folders: a skipped page loses files.
    cache = str(tmp_path / "c")
    server.reset_stats()
    r = run_cli(["download", "org/model", "--cache-dir", cache, "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    pages = [q for q in server.stats()["requests"] if "/tree/" in q]
    assert len(pages) >= 3, pages
    snap = r.stdout.strip()
    listing = json.load(open(os.path.join(cache, "models--org--model", "trees", os.path.basename(snap) + ".json")))
    assert sorted(listing["files"]) == ["config.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                        "sub/dir/notes.txt"]
    assert all(os.path.exists(os.path.join(snap, f)) for f in listing["files"])


def test_a_failed_download_leaves_a_snapshot_both_tools_see_as_partial(server, tmp_path, hf):
    cache = str(tmp_path / "c")
    env = {"HF_ENDPOINT": server.endpoint}
    server.set_fault("500", count=1000, path="model-00002-of-00002")
    r = run_cli(["download", "org/model", "--cache-dir", cache, "-q", "--workers", "1"], env)
    assert r.returncode == 1 and "HTTP 500" in r.stderr
    server.set_fault("none", 0)
    r = run_cli(["download", "org/model", "--cache-dir", cache, "--offline"])
    assert r.returncode == 1
    assert "is incomplete" in r.stderr and "model-00002-of-00002.safetensors" in r.stderr, r.stderr
    # What was asked for and is there still serves offline.
    r = run_cli(["download", "org/model", "--cache-dir", cache, "--offline", "--include",
                 "model-00001-of-00002.safetensors"])
    assert r.returncode == 0, r.stderr
    check_cache_clean(cache)
    if hf == "hf2":  # 0.27 keeps no tree listing: it cannot tell a partial snapshot from a whole one
        theirs = hf_python(
            "import huggingface_hub as h\n"
            f"h.snapshot_download('org/model', cache_dir={cache!r})",
            {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}, hf, check=False)
        assert theirs.returncode != 0 and "IncompleteSnapshotError" in theirs.stderr, theirs.stderr
    # The next online run completes it, and both tools accept it again.
    r = run_cli(["download", "org/model", "--cache-dir", cache, "-q"], env)
    assert r.returncode == 0, r.stderr
    r = run_cli(["download", "org/model", "--cache-dir", cache, "--offline"])
    assert r.returncode == 0, r.stderr


def test_a_partial_file_left_by_huggingface_hub_2_is_resumed(server, tmp_path):
    # 2.x names its partial "{etag}.{8 hex}.incomplete" (and never resumes it); we adopt it as a prefix.
    cache = tmp_path / "c"
    data = det_bytes(3 << 20, 1)
    etag = hashlib.sha256(data).hexdigest()
    blobs = cache / "models--org--model" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (etag + ".0badc0de.incomplete")).write_bytes(data[: 1 << 20])
    server.reset_stats()
    r = run_cli(["download", "org/model", "--include", "model-00001-of-00002.safetensors", "--cache-dir", str(cache),
                 "-q"], {"HF_ENDPOINT": server.endpoint})
    assert r.returncode == 0, r.stderr
    assert open(os.path.join(r.stdout.strip(), "model-00001-of-00002.safetensors"), "rb").read() == data
    assert server.stats()["bytes"]["model-00001-of-00002.safetensors"] == len(data) - (1 << 20)
    assert sorted(os.listdir(blobs)) == [etag]


def test_modelscope_download_is_found_offline_by_modelscopes_own_client(server, tmp_path):
    msd = pytest.importorskip("modelscope_hub.compat.snapshot_download")
    cache = tmp_path / "ms"
    env = {"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_DOMAIN": server.endpoint}
    r = run_cli(["download", "org/model", "--revision", "master", "--cache-dir", str(cache), "-q"], env)
    assert r.returncode == 0, r.stderr
    ours = r.stdout.strip()
    theirs = msd.snapshot_download(model_id="org/model", cache_dir=str(cache), local_files_only=True)
    assert os.path.realpath(theirs) == os.path.realpath(ours)
    assert open(os.path.join(theirs, "sub", "dir", "notes.txt"), "rb").read() == b"hello\n"
    # And ours offline finds it again without the network.
    r = run_cli(["download", "org/model", "--revision", "master", "--cache-dir", str(cache), "--offline"], env)
    assert r.returncode == 0 and r.stdout.strip() == ours, r.stderr
