"""Shared helpers for the Hub tests: a loopback Hub server over a temp folder,
and running `weightlift download`."""
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hubserver"))
from hubserver import HubServer  # noqa: E402, F401  (the tests import it from here)

CLI = os.environ.get("WEIGHTLIFT_CLI") or os.path.join(HERE, "..", "..", "build", "bin", "weightlift")
TOKEN = "hf_wltesttoken_" + "x" * 20

# huggingface_hub releases the interop tests run against: the pinned one in the
# venv (requirements-dev.txt) and the current one that scripts/setup installs
# into .venv/hf2 (requirements-hub2.txt), seen through PYTHONPATH.
HF2_DIR = os.path.join(HERE, "..", "..", ".venv", "hf2")
HF_RELEASES = {"hf0.27": {}, "hf2": {"PYTHONPATH": os.path.abspath(HF2_DIR)}}


def hf_release_available(name):
    if name == "hf2":
        return os.path.isdir(os.path.join(HF2_DIR, "huggingface_hub"))
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        return False
    return True


def hf_python(code, env, release="hf0.27", check=True):
    """Runs `code` in a fresh interpreter that imports the given huggingface_hub release."""
    e = dict(os.environ)
    e.pop("HF_TOKEN", None)
    e.update(HF_RELEASES[release])
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    return r


def write_repo(root, repo_id, revision, files, gated=False, extra_names=None):
    base = os.path.join(root, repo_id)
    for name, data in files.items():
        p = os.path.join(base, revision, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    if gated:
        open(os.path.join(base, ".gated"), "w").close()
    if extra_names:
        with open(os.path.join(base, "." + revision + ".extra.json"), "w") as f:
            json.dump(extra_names, f)


def det_bytes(n, seed=0):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d-%d" % (seed, i)).digest() * 64
        i += 1
    return bytes(out[:n])


def run_cli(args, env=None, timeout=300):
    e = dict(os.environ)
    e.pop("HF_TOKEN", None)
    e.update(env or {})
    return subprocess.run([CLI] + args, capture_output=True, text=True, env=e, timeout=timeout)


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_cache_clean(cache):
    """Every blob under a final name matches its ETag (no corrupt or partial file)."""
    for dirpath, _, names in os.walk(cache):
        if not dirpath.endswith("blobs"):
            continue
        for n in names:
            if "." in n:  # {etag}.{uuid}.incomplete and its .ranges journal: partial by name, never linked
                continue
            with open(os.path.join(dirpath, n), "rb") as f:
                data = f.read()
            ok = hashlib.sha256(data).hexdigest() == n if len(n) == 64 else git_blob_sha1(data) == n
            assert ok, "blob %s does not match its name" % n
    for dirpath, _, names in os.walk(cache):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                assert os.path.exists(p), "dangling symlink " + p
                assert not os.path.isabs(os.readlink(p))
