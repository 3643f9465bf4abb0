"""weightlift against two real S3 servers (moto and SeaweedFS) on loopback,
signatures checked: listing, every strategy, the Python iterator, download,
and the errors a user meets (bad keys, missing key or bucket)."""
from __future__ import annotations

import json
import os
import struct

import pytest

from .s3cli import BUCKET, UNRELATED, checksums, sh, sha256

URL = f"s3://{BUCKET}/llama/"
STRATEGIES = ["lazy", "eager", "threads", "prefetch", "stream", "auto"]


def reference_order(model, files):
    """The reference's yield order: files as given, each file's tensors by offset."""
    names = []
    for f in files:
        with open(model / os.path.basename(f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        names += [k for k, _ in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])]
    return names


def test_listing_picks_the_model_not_the_unrelated_files(server, model):
    r = sh("ls", URL, "--format", "jsonl", env=server.env())
    files = sorted({json.loads(line)["file"] for line in r.stdout.splitlines()})
    shards = sorted(p.name for p in model.glob("*.safetensors"))
    assert files == [URL + s for s in shards]
    for junk in UNRELATED:
        assert junk not in r.stdout


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_matches_the_local_copy(server, local_sums, strategy):
    extra = ["--strategy", strategy, "--threads", "4", "--block-size", "256KiB"]
    assert checksums(URL, *extra, env=server.env()) == local_sums


def test_auto_picks_stream_for_object_storage(server):
    r = sh("load", URL, "--verbose", "--no-progress", env=server.env())
    assert "auto: stream (s3:// is a remote source" in r.stderr
    assert "strategy stream (buffered)" in r.stderr


def test_stream_under_a_small_memory_cap(server, local_sums):
    extra = ["--strategy", "stream", "--max-memory", "1MiB", "--block-size", "256KiB"]
    assert checksums(URL, *extra, env=server.env()) == local_sums


def test_python_iterator_order_bytes_and_ownership(server, model, monkeypatch):
    import weightlift
    from weightlift import vllm_compat
    from weightlift._tensors import tensor_bytes

    assert vllm_compat.runai_safetensors_weights_iterator is weightlift.runai_safetensors_weights_iterator
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    files, _ = weightlift.find_weight_files(URL)
    remote = list(weightlift.runai_safetensors_weights_iterator(files, use_tqdm_on_load=False))
    local_files = [str(model / os.path.basename(f)) for f in files]
    local = list(weightlift.runai_safetensors_weights_iterator(local_files, False))
    assert [n for n, _ in remote] == reference_order(model, files) == [n for n, _ in local]
    for (n, a), (_, b) in zip(remote, local):
        assert a.dtype == b.dtype and a.shape == b.shape, n
        assert sha256(tensor_bytes(a)[2].tobytes()) == sha256(tensor_bytes(b)[2].tobytes()), n
    # Owned tensors: no two share memory, each may be written.
    ptrs = [t.data_ptr() for _, t in remote if t.numel()]
    assert len(set(ptrs)) == len(ptrs)
    remote[0][1].zero_()
    # is_distributed is accepted (every rank reads everything for now).
    again = list(weightlift.runai_safetensors_weights_iterator(files[:1], False, is_distributed=True))
    assert [n for n, _ in again] == reference_order(model, files[:1])


def test_download_copies_weights_and_configs(server, model, tmp_path):
    out = tmp_path / "weights-only"
    sh("download", URL, out, "-q", env=server.env())
    wanted = sorted(p.name for p in model.glob("*.safetensors")) + ["model.safetensors.index.json"]
    assert sorted(os.listdir(out)) == sorted(wanted)
    out2 = tmp_path / "with-configs"
    r = sh("download", URL, out2, "--configs", env=server.env())
    assert r.stdout.strip() == str(out2)
    names = sorted(os.listdir(out2))
    # Configs at any depth go to their sub-folder (llama/notes/changelog.txt: *.txt), as vLLM's pull keeps
    # them; what is neither weights nor configs is named, never skipped silently.
    top = sorted(p.name for p in model.iterdir() if p.is_file())
    assert names == sorted(top + ["notes"])
    for n in top:
        assert (out2 / n).read_bytes() == (model / n).read_bytes(), n
    assert (out2 / "notes" / "changelog.txt").read_bytes() == UNRELATED["llama/notes/changelog.txt"]
    assert f"left out 1 other file under {URL} (not weights or configs): training_args.bin" in r.stderr, r.stderr
    assert checksums(out2) == checksums(model)


def test_bad_secret_is_refused_with_the_s3_code(server):
    env = dict(server.env(), AWS_SECRET_ACCESS_KEY="not-the-secret")
    r = sh("load", URL, "--no-progress", env=env, check=False)
    assert r.returncode == 1
    assert "access denied (HTTP 403 SignatureDoesNotMatch" in r.stderr, r.stderr
    assert "not-the-secret" not in r.stderr


def test_unknown_access_key_is_refused(server):
    env = dict(server.env(), AWS_ACCESS_KEY_ID="AKIAUNKNOWNKEY000000")
    r = sh("ls", URL, env=env, check=False)
    assert r.returncode == 1
    assert "access denied (HTTP 403 InvalidAccessKeyId" in r.stderr, r.stderr


def test_python_raises_permission_error(server, monkeypatch):
    import weightlift

    for k, v in dict(server.env(), AWS_SECRET_ACCESS_KEY="wrong-secret").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(PermissionError, match=r"s3://models/llama/model-00001-of-00002.safetensors: access denied "
                                              r"\(HTTP 403 SignatureDoesNotMatch"):
        list(weightlift.runai_safetensors_weights_iterator([URL + "model-00001-of-00002.safetensors"], False))


def test_missing_key_and_missing_bucket(server):
    r = sh("load", URL + "model-00009-of-00009.safetensors", env=server.env(), check=False)
    assert r.returncode == 1
    assert f"{URL}model-00009-of-00009.safetensors: no such key (HTTP 404 NoSuchKey" in r.stderr, r.stderr
    r = sh("ls", "s3://no-such-bucket-wl/llama/", env=server.env(), check=False)
    assert r.returncode == 1
    assert "s3://no-such-bucket-wl/llama/: no such bucket (HTTP 404 NoSuchBucket" in r.stderr, r.stderr
    r = sh("ls", f"s3://{BUCKET}/no-model-here/", env=server.env(), check=False)
    assert r.returncode == 1
    assert "no objects under it as a prefix" in r.stderr, r.stderr


def test_no_credentials_and_anonymous_requests(stocked_seaweed):
    env = {"AWS_ENDPOINT_URL": stocked_seaweed.endpoint, "HOME": "/nonexistent"}
    r = sh("ls", URL, env=env, check=False)
    assert r.returncode == 1
    assert "no credentials for s3://: set AWS_ACCESS_KEY_ID" in r.stderr, r.stderr
    r = sh("ls", URL, env=dict(env, AWS_NO_SIGN_REQUEST="1"), check=False)
    assert r.returncode == 1
    assert "access denied (HTTP 403 AccessDenied" in r.stderr, r.stderr
    assert "an unsigned (anonymous) request" in r.stderr, r.stderr


def test_profile_from_the_shared_credentials_file(stocked_seaweed, tmp_path, local_sums):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[other]\naws_access_key_id = nope\naws_secret_access_key = nope\n\n"
        f"[wl]\naws_access_key_id = {stocked_seaweed.access_key}\n"
        f"aws_secret_access_key = {stocked_seaweed.secret_key}\n")
    (tmp_path / ".aws" / "config").write_text(
        f"[profile wl]\nregion = us-east-1\nendpoint_url = {stocked_seaweed.endpoint}\n")
    env = {"HOME": str(tmp_path), "AWS_PROFILE": "wl"}
    assert checksums(URL, env=env) == local_sums
    r = sh("ls", URL, env=dict(env, AWS_PROFILE="missing"), check=False)
    assert "AWS profile 'missing' is in neither" in r.stderr, r.stderr


def test_gs_urls_through_the_xml_api_with_hmac_keys(stocked_moto, local_sums):
    env = {"WEIGHTLIFT_GS_ENDPOINT_URL": stocked_moto.endpoint, "GS_ACCESS_KEY_ID": stocked_moto.access_key,
           "GS_SECRET_ACCESS_KEY": stocked_moto.secret_key}
    assert checksums(f"gs://{BUCKET}/llama/", "--strategy", "stream", env=env) == local_sums
