"""Faults between weightlift and SeaweedFS (a proxy on loopback): resets in the
middle of a ranged body and 503 SlowDown are retried and resumed with the
right bytes at the end; a body shorter than its range is an error naming the
URL; listings page over more than 1,000 keys."""
from __future__ import annotations

import os

from .s3cli import BUCKET, checksums, sh, upload

URL = f"s3://{BUCKET}/llama/"


def test_resets_and_slowdown_are_survived(proxy, local_sums, stocked_seaweed):
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    faults = ["reset:100000", "slowdown", "reset:1", "slowdown", "reset:200000", "slowdown"]
    proxy.add(*faults)
    got = checksums(URL, "--strategy", "stream", "--threads", "4", "--block-size", "512KiB", env=env)
    assert got == local_sums
    assert proxy.applied == faults


def test_resets_during_eager_whole_file_reads(proxy, local_sums, stocked_seaweed):
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    proxy.add("reset:300000", "reset:700000", "reset:50000")
    assert checksums(URL, "--strategy", "eager", env=env) == local_sums
    assert len(proxy.applied) == 3


def test_short_body_is_an_error_naming_the_url(proxy, stocked_seaweed):
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    proxy.add(*["short"] * 50)
    r = sh("load", URL, "--strategy", "stream", "--no-progress", env=env, check=False)
    assert r.returncode == 1
    assert f"weightlift: error: {URL}model" in r.stderr and "the server answered Content-Range" in r.stderr, r.stderr


def test_object_replaced_after_planning_is_aborted(proxy, stocked_seaweed, model_files):
    c = stocked_seaweed.client()
    shard = sorted(n for n in model_files if n.endswith(".safetensors"))[0]
    upload(c, BUCKET, {f"swap/{n}": b for n, b in model_files.items()})
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    # The shard's first ranged read (its header, after the planning HEAD took the ETag) meets a new
    # version of the same size whose header is unchanged: only the ETag (If-Match) can tell.
    changed = model_files[shard][:-1] + bytes([model_files[shard][-1] ^ 1])  # same size, another last byte
    proxy.add((f"swap/{shard}", lambda: c.put_object(Bucket=BUCKET, Key=f"swap/{shard}", Body=changed)))
    r = sh("load", f"s3://{BUCKET}/swap/", "--strategy", "stream", "--no-progress", env=env, check=False)
    assert r.returncode == 1
    assert f"s3://{BUCKET}/swap/{shard}: the file changed since the load was planned" in r.stderr, r.stderr


def test_failed_download_leaves_no_file(proxy, stocked_seaweed, tmp_path):
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    # Resumed (fewer near-empty resets in a row than the retries: five would be given up on,
    # as a trickling server is), then a body shorter than its range.
    proxy.add(*["reset:1000"] * 3, *["short"] * 100)
    out = tmp_path / "dl"
    r = sh("download", URL, out, "-q", "--chunk", "1MB", env=env, check=False)
    assert r.returncode == 1
    assert "the server answered Content-Range" in r.stderr, r.stderr
    assert not out.exists() or os.listdir(out) == [], os.listdir(out)


def test_slowdown_that_never_ends_fails_cleanly(proxy, stocked_seaweed):
    env = stocked_seaweed.env(endpoint=proxy.endpoint)
    proxy.add(*["slowdown"] * 200)
    r = sh("load", URL, "--strategy", "lazy", "--no-progress", env=env, check=False, timeout=120)
    assert r.returncode == 1
    assert "server busy or failing (HTTP 503)" in r.stderr and "after 5 attempts" in r.stderr, r.stderr


def test_listing_pages_past_1000_keys(stocked_seaweed, model_files, local_sums, monkeypatch):
    # 1,050 unrelated keys sort before the model's files: the model is only on the second page.
    items = {f"wide/junk-{i:04d}.txt": b"x" for i in range(1050)}
    items.update({f"wide/{n}": b for n, b in model_files.items() if n.endswith((".safetensors", ".json"))})
    upload(stocked_seaweed.client(), BUCKET, items)
    assert checksums(f"s3://{BUCKET}/wide/", env=stocked_seaweed.env()) == local_sums

    import weightlift

    for k, v in stocked_seaweed.env().items():
        monkeypatch.setenv(k, v)
    files, fmt = weightlift.find_weight_files(f"s3://{BUCKET}/wide/")
    assert [os.path.basename(f) for f in files] == sorted(n for n in model_files if n.endswith(".safetensors"))
