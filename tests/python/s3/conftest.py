"""Fixtures of the object-storage tests: moto and SeaweedFS started once per
pytest session on loopback (signatures checked), a synthesized model uploaded
to each, and the CLI run against them."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from s3servers import FaultProxy, MotoServer, SeaweedServer  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))
BUCKET = "models"
# Besides the model: files a bucket holds that a load must not pick up.
UNRELATED = {
    "README.md": b"# models bucket\n",
    "llama-v2/model.safetensors": b"not a model under the llama/ prefix",
    "llama/notes/changelog.txt": b"a subfolder of the model prefix\n",
    "llama/training_args.bin": b"training-only file",
}


def sh(*args, env=None, check=True, timeout=300):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GS_", "RUNAI_STREAMER_", "GOOGLE_"))}
    e.update(env or {})
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"weightlift {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


def checksums(path, *extra, env=None):
    """[(name, dtype, shape, sha256)] of every tensor, in checkpoint order."""
    r = sh("load", path, "--checksum", "--format", "jsonl", "--no-progress", *extra, env=env)
    return [tuple(json.dumps(v) if isinstance(v, list) else v for v in json.loads(line).values())
            for line in r.stdout.splitlines()]


def upload(client, bucket, items: dict[str, bytes]):
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), items.items()))


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A TINY synthesized model in two shards with its index, plus a tokenizer file."""
    d = tmp_path_factory.mktemp("s3model") / "llama"
    sh("synth", d, "--size", "TINY", "--shards", "2")
    (d / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (d / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    return d


@pytest.fixture(scope="session")
def model_files(model):
    return {p.name: p.read_bytes() for p in sorted(model.iterdir()) if p.is_file()}


@pytest.fixture(scope="session")
def local_sums(model):
    return checksums(model)


@pytest.fixture(scope="session")
def moto():
    s = MotoServer()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def seaweed():
    s = SeaweedServer()
    yield s
    s.stop()


def _stock(server, model_files):
    c = server.client()
    c.create_bucket(Bucket=BUCKET)
    items = {f"llama/{n}": b for n, b in model_files.items()}
    items.update(UNRELATED)
    upload(c, BUCKET, items)
    return server


@pytest.fixture(scope="session")
def stocked_moto(moto, model_files):
    return _stock(moto, model_files)


@pytest.fixture(scope="session")
def stocked_seaweed(seaweed, model_files):
    return _stock(seaweed, model_files)


@pytest.fixture(scope="session", params=["moto", "seaweedfs"])
def server(request):
    """Each test using it runs against both implementations, the model uploaded."""
    return request.getfixturevalue("stocked_moto" if request.param == "moto" else "stocked_seaweed")


@pytest.fixture()
def proxy(stocked_seaweed):
    p = FaultProxy(stocked_seaweed.endpoint)
    yield p
    p.stop()


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()
