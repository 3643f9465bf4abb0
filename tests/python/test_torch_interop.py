"""weightlift on PyTorch checkpoints written by a real torch: listing, checksums, conversion, hostile pickles."""
import collections
import hashlib
import json
import os

import pytest

torch = pytest.importorskip("torch")

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
    torch.complex64: "C64",
}


def logical_sha(t):
    t = t.detach().contiguous().flatten()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def make_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()
    for dt in DTYPES:
        if dt.is_floating_point or dt.is_complex:
            sd[f"w_{DTYPES[dt]}"] = torch.randn(4, 6, generator=g).to(dt)
        elif dt == torch.bool:
            sd["w_BOOL"] = torch.rand(4, 6, generator=g) > 0.5
        else:
            sd[f"w_{DTYPES[dt]}"] = torch.randint(-100 if dt != torch.uint8 else 0, 100, (4, 6), generator=g, dtype=dt)
    base = torch.randn(8, 16, generator=g)
    sd["embed"] = base
    sd["head"] = base                     # tied
    sd["t"] = base.t()                    # transpose of the same storage
    sd["slice"] = base[2:6, 3:11:2]       # offset + strides
    sd["scalar"] = torch.tensor(7, dtype=torch.int64)
    sd["empty"] = torch.zeros(0, 5)
    return sd


@pytest.mark.parametrize("legacy", [False, True])
def test_ls_matches_torch_load(tmp_path, cli, legacy):
    path = tmp_path / "pytorch_model.bin"
    torch.save(make_state(), path, _use_new_zipfile_serialization=not legacy)
    rows = [json.loads(line) for line in cli("ls", "--format", "jsonl", path).stdout.splitlines()]
    loaded = torch.load(path, weights_only=True)
    assert [r["name"] for r in rows] == list(loaded)
    for r in rows:
        t = loaded[r["name"]]
        assert r["dtype"] == DTYPES[t.dtype]
        assert r["shape"] == list(t.shape)
        assert r["bytes"] == t.numel() * t.element_size()
        assert (r["offset"] is None) == (not t.is_contiguous())


def test_load_checksums_match_torch(tmp_path, cli):
    path = tmp_path / "pytorch_model.bin"
    torch.save(make_state(1), path)
    r = cli("load", "--checksum", "--format", "jsonl", path, check=False)
    if r.returncode != 0 and "safetensors" in r.stderr:
        pytest.skip("weightlift load does not route PyTorch files yet: " + r.stderr.strip())
    assert r.returncode == 0, r.stderr
    loaded = torch.load(path, weights_only=True)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    got = {row["name"]: row["sha256"] for row in rows if "sha256" in row}
    assert got == {k: logical_sha(v) for k, v in loaded.items()}


def test_convert_matches_the_reference(tmp_path, cli):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    src = tmp_path / "pytorch_model.bin"
    state = make_state(2)
    del state["w_C64"]  # safetensors' PyPI package of this pin cannot hold complex
    torch.save({"state_dict": state, "epoch": 1}, src)
    out = tmp_path / "model.safetensors"
    cli("convert", src, out)
    ours = safetensors_torch.load_file(str(out))
    # The reference: unwrap state_dict, drop names whose data_ptr repeats, make contiguous.
    loaded = torch.load(src, weights_only=True)["state_dict"]
    seen, want = set(), {}
    for k, v in loaded.items():
        if v.data_ptr() in seen and v.numel():
            continue
        seen.add(v.data_ptr())
        want[k] = v.contiguous()
    assert sorted(ours) == sorted(want)
    for k, v in want.items():
        assert ours[k].dtype == v.dtype and torch.equal(ours[k], v), k
    with open(out, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["__metadata__"] == {"format": "pt"}


def test_convert_folder_writes_index(tmp_path, cli):
    pytest.importorskip("safetensors")
    model = tmp_path / "m"
    model.mkdir()
    a = {"a.weight": torch.randn(3, 3)}
    b = {"b.weight": torch.randn(2, 2), "b.bias": torch.randn(2)}
    torch.save(a, model / "pytorch_model-00001-of-00002.bin")
    torch.save(b, model / "pytorch_model-00002-of-00002.bin")
    cli("convert", model)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"a.weight": "model-00001-of-00002.safetensors",
                                   "b.bias": "model-00002-of-00002.safetensors",
                                   "b.weight": "model-00002-of-00002.safetensors"}
    assert index["metadata"]["total_size"] == (9 + 4 + 2) * 4


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_and_never_runs(tmp_path, cli):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.bin"
    torch.save({"w": torch.zeros(2), "x": Evil(marker)}, path)
    r = cli("ls", path, check=False)
    assert r.returncode == 1
    assert "posix.system" in r.stderr and str(path) in r.stderr
    r = cli("convert", path, tmp_path / "evil.safetensors", check=False)
    assert r.returncode == 1
    assert not marker.exists()
    assert not (tmp_path / "evil.safetensors").exists()


def test_legacy_file_with_pickles_larger_than_the_first_read(tmp_path, cli):
    # The legacy reader decodes the first 16 MiB, then grows: a 20 MB string in the pickle forces that.
    path = tmp_path / "big_pickle.bin"
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.save({"note": "x" * 20_000_000, "w": w, "wt": w.t()}, path, _use_new_zipfile_serialization=False)
    rows = [json.loads(line) for line in cli("ls", "--format", "jsonl", path).stdout.splitlines()]
    assert [(r["name"], r["shape"]) for r in rows] == [("w", [3, 4]), ("wt", [4, 3])]
    assert rows[0]["offset"] is not None and rows[1]["offset"] is None
