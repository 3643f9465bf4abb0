"""Port of vLLM's test_filter_duplicate_safetensors.py (the cases on main)."""
import json
import os

import pytest

from weightlift.vllm_compat import filter_duplicate_safetensors_files

INDEX = "model.safetensors.index.json"


def _write(folder, names, weight_map):
    files = []
    for n in names:
        p = os.path.join(folder, n)
        open(p, "wb").close()
        files.append(p)
    with open(os.path.join(folder, INDEX), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return files


def test_index_names_a_missing_file(tmp_path):
    d = str(tmp_path)
    files = _write(d, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
                   {"layer.0.weight": "model-00001-of-00002.safetensors",
                    "layer.1.weight": "model-00002-of-00002.safetensors",
                    "layer.2.weight": "model-00003-of-00002.safetensors"})
    with pytest.raises(FileNotFoundError) as e:
        filter_duplicate_safetensors_files(hf_weights_files=files, hf_folder=d, index_file=INDEX)
    assert "model-00003-of-00002.safetensors" in str(e.value)


def test_every_indexed_file_exists(tmp_path):
    d = str(tmp_path)
    files = _write(d, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
                   {"layer.0.weight": "model-00001-of-00002.safetensors",
                    "layer.1.weight": "model-00002-of-00002.safetensors"})
    assert filter_duplicate_safetensors_files(hf_weights_files=files, hf_folder=d, index_file=INDEX) == files


def test_consolidated_file_dropped(tmp_path):
    """Mistral-7B-v0.3 ships shards and a consolidated file; the index keeps the shards."""
    d = str(tmp_path)
    files = _write(d, ["consolidated.safetensors", "model-00001-of-00002.safetensors",
                       "model-00002-of-00002.safetensors"],
                   {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    assert filter_duplicate_safetensors_files(files, d, INDEX) == files[1:]


def test_no_index_keeps_everything(tmp_path):
    files = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    assert filter_duplicate_safetensors_files(files, str(tmp_path), INDEX) == files
