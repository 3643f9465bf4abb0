"""The read-ahead (weightlift._engine.read_ahead) of an object-storage
prefix: staged before the load, then consumed by it: the load's bytes equal
a plain load's and the staging was read (not the server again)."""
from __future__ import annotations

import os

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
    try:
        list(iterate(files, read_ahead=object()))
    except (TypeError, ValueError, RuntimeError) as e:
        assert "ReadAhead" in str(e) or "read_ahead" in str(e) or "incompatible" in str(e), e
    else:
        raise AssertionError("a bad read_ahead option was accepted")


def test_ranks_stage_disjoint_slices(stocked_moto, monkeypatch):
    import weightlift
    from weightlift._engine import read_ahead

    for k, v in stocked_moto.env().items():
        monkeypatch.setenv(k, v)
    files, _ = weightlift.find_weight_files(URL)
    jobs = [read_ahead(files, rank=r, world_size=2, block_size=1 << 16) for r in range(2)]
    for j in jobs:
        assert j.wait() == ""
    got = [j.progress() for j in jobs]
    assert got[0]["bytes_planned"] + got[1]["bytes_planned"] == sum(_tensor_bytes(files))
    assert abs(got[0]["bytes_planned"] - got[1]["bytes_planned"]) <= 1


def _tensor_bytes(files) -> int:
    from weightlift import _core
    from weightlift._tensors import DTYPE_SIZES

    total = 0
    for _, dtype, shape in _core.list_tensors(list(files)):
        n = DTYPE_SIZES[dtype]
        for d in shape:
            n *= d
        total += n
    return total
