"""Our safetensors reader and writer against Hugging Face's `safetensors` package."""
import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import run_cli

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def _sha(t: torch.Tensor) -> str:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        b = t.view(torch.int16).numpy().tobytes()
    else:
        b = t.numpy().tobytes()
    return hashlib.sha256(b).hexdigest()


def test_reader_matches_safetensors_package(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dt in enumerate(DTYPES):
        shape = [(i % 3) + 1, 5, 0 if i == 4 else 3][: (i % 3) + 1]
        if dt.is_floating_point:
            tensors[f"w{i}"] = torch.randn(*shape, generator=g).to(dt)
        elif dt == torch.bool:
            tensors[f"w{i}"] = torch.randint(0, 2, shape, generator=g).bool()
        else:
            tensors[f"w{i}"] = torch.randint(-100, 100, shape, generator=g).to(dt)
    tensors["scalar"] = torch.tensor(3.5)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    out = run_cli("load", path, "--checksum", "--format", "jsonl", "--no-progress").stdout
    rows = {json.loads(line)["name"]: json.loads(line) for line in out.splitlines()}
    assert set(rows) == set(tensors)
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            assert rows[name]["sha256"] == _sha(t), name
            assert rows[name]["shape"] == list(t.shape)


def test_writer_output_is_byte_identical_to_safetensors(tmp_path, cli):
    """Re-saving our synthesized shards with save_file gives the same bytes."""
    cli("synth", tmp_path / "m", "--size", "TINY")
    shards = sorted((tmp_path / "m").glob("model-*.safetensors"))
    assert len(shards) >= 2
    for shard in shards:
        ours = shard.read_bytes()
        theirs_path = tmp_path / ("re-" + shard.name)
        with safe_open(str(shard), framework="pt") as f:
            meta = f.metadata()
        save_file(load_file(str(shard)), str(theirs_path), metadata=meta)
        assert theirs_path.read_bytes() == ours, shard.name


def test_index_matches_transformers_layout(tmp_path, cli):
    cli("synth", tmp_path / "m", "--size", "TINY")
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    total = 0
    for shard in sorted((tmp_path / "m").glob("model-*.safetensors")):
        for name, t in load_file(str(shard)).items():
            assert index["weight_map"][name] == shard.name
            total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "llama"


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_synth_checksums_match_torch(tmp_path, cli, strategy):
    cli("synth", tmp_path / "m", "--size", "TINY", "--seed", "11")
    out = cli("load", tmp_path / "m", "--strategy", strategy, "--checksum", "--format", "jsonl",
              "--no-progress").stdout
    rows = {json.loads(line)["name"]: json.loads(line) for line in out.splitlines()}
    n = 0
    for shard in sorted((tmp_path / "m").glob("model-*.safetensors")):
        for name, t in load_file(str(shard)).items():
            assert rows[name]["sha256"] == _sha(t)
            assert rows[name]["dtype"] == {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype]
            n += 1
    assert n == len(rows)
