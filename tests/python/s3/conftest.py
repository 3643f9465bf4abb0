"""Fixtures of the object-storage tests: moto and SeaweedFS started once per
pytest session on loopback (signatures checked), a synthesized model uploaded
to each, and the CLI run against them."""
from __future__ import annotations

import os

import pytest

from .s3cli import BUCKET, UNRELATED, checksums, sh, upload
from .s3servers import FaultProxy, MotoServer, SeaweedServer


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """No object-storage settings of the machine leak into a test (in-process Python calls)."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "GS_", "RUNAI_STREAMER_", "GOOGLE_", "CLOUDSDK_", "WEIGHTLIFT_GS_")):
            monkeypatch.delenv(k)


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
