"""The read-ahead (weightlift._engine.read_ahead) of an object-storage
prefix: staged before the load, then consumed by it: the load's bytes equal
a plain load's and the staging was read (not the server again)."""
from __future__ import annotations

import os

import pytest

from .s3cli import BUCKET, sha256

URL = f"s3://{BUCKET}/llama/"


def test_a_load_reads_the_staged_bytes(stocked_moto, model, monkeypatch):
    import weightlift
    from weightlift._engine import iterate, read_ahead
    from weightlift._tensors import tensor_bytes

    for k, v in stocked_moto.env().items():
        monkeypatch.setenv(k, v)
    files, _ = weightlift.find_weight_files(URL)
    job = read_ahead(files)
    assert job.wait() == ""
    p = job.progress()
    assert p["remote"] and p["done"] and p["bytes_read"] == p["bytes_planned"] > 0, p
    staged = {n: sha256(tensor_bytes(t)[2].tobytes()) for n, t in iterate(files, strategy="stream", read_ahead=job)}
    local = [str(model / os.path.basename(f)) for f in files]
    plain = {n: sha256(tensor_bytes(t)[2].tobytes()) for n, t in iterate(local)}
    assert staged == plain
    assert job.progress()["bytes_consumed"] == p["bytes_planned"]
    # The option takes a ReadAhead, nothing else.
    with pytest.raises(TypeError, match="engine option read_ahead takes a weightlift._core.ReadAhead"):
        list(iterate(files, read_ahead=object()))


def test_ranks_stage_disjoint_slices(stocked_moto, monkeypatch):
    import weightlift
    from weightlift._engine import read_ahead

    for k, v in stocked_moto.env().items():
        monkeypatch.setenv(k, v)
    files, _ = weightlift.find_weight_files(URL)
    whole = read_ahead(files)
    assert whole.wait() == ""
    jobs = [read_ahead(files, rank=r, world_size=2, block_size=1 << 16) for r in range(2)]
    for j in jobs:
        assert j.wait() == ""
    got = [j.progress() for j in jobs]
    assert got[0]["bytes_planned"] + got[1]["bytes_planned"] == whole.progress()["bytes_planned"]
    assert got[0]["bytes_read"] == got[0]["bytes_planned"] and got[1]["bytes_read"] == got[1]["bytes_planned"]
    assert abs(got[0]["bytes_planned"] - got[1]["bytes_planned"]) <= 1

