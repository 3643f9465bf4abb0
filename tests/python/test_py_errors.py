"""Bad inputs surface as Python exceptions carrying the engine's message
(the file, the tensor, what is wrong)."""
import json
import os
import pickle
import struct

import pytest
import torch
from safetensors.torch import save_file

import weightlift
from weightlift import vllm_compat as wu


def _header_file(path, header: dict, data: bytes = b""):
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    return str(path)


def test_missing_file(tmp_path):
    p = str(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        list(wu.safetensors_weights_iterator([p], False))
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        weightlift.safe_open(p)
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        list(weightlift.stream_weights([p]))
    with pytest.raises(FileNotFoundError):
        list(weightlift.stream_weights(str(tmp_path / "no-such-folder")))


def test_truncated_header(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="short.safetensors") as e:
        list(wu.safetensors_weights_iterator([str(p)], False))
    assert isinstance(e.value, weightlift.CorruptDataError)


def test_header_larger_than_file(tmp_path):
    p = tmp_path / "big.safetensors"
    p.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(weightlift.CorruptDataError, match="big.safetensors"):
        weightlift.safe_open(str(p))


def test_bad_json(tmp_path):
    p = tmp_path / "json.safetensors"
    p.write_bytes(struct.pack("<Q", 8) + b"{not js}")
    with pytest.raises(weightlift.CorruptDataError, match="json.safetensors"):
        list(wu.safetensors_weights_iterator([str(p)], False, "eager"))


def test_unknown_dtype_names_tensor(tmp_path):
    p = _header_file(tmp_path / "dt.safetensors", {"w": {"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}},
                     b"\0" * 4)
    with pytest.raises(weightlift.CorruptDataError, match=r"dt\.safetensors.*'w'"):
        weightlift.safe_open(p)


def test_offsets_past_end(tmp_path):
    p = _header_file(tmp_path / "oob.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                     b"\0" * 8)
    with pytest.raises(weightlift.CorruptDataError, match="oob.safetensors"):
        list(weightlift.stream_weights([p]))


def test_missing_tensor_is_key_error(tmp_path):
    p = str(tmp_path / "m.safetensors")
    save_file({"a": torch.zeros(1)}, p)
    with weightlift.safe_open(p) as f:
        with pytest.raises(KeyError, match="^File does not contain tensor b$") as e:
            f.get_tensor("b")  # safetensors' message; a KeyError and a SafetensorError
        assert isinstance(e.value, weightlift.safetensors.SafetensorError)
        with pytest.raises(KeyError):
            f.get_slice("b")


def test_bad_arguments(tmp_path):
    p = str(tmp_path / "m.safetensors")
    save_file({"a": torch.zeros(1)}, p)
    with pytest.raises(ValueError, match="safetensors_load_strategy"):
        list(wu.safetensors_weights_iterator([p], False, "fast"))
    with pytest.raises(ValueError, match="unknown strategy 'fast'"):
        list(weightlift.stream_weights([p], "fast"))
    with pytest.raises(ValueError, match="no option 'colour'"):
        list(weightlift.stream_weights([p], colour="blue"))
    with pytest.raises(ValueError, match="framework"):
        weightlift.safe_open(p, framework="tf")
    with pytest.raises(ValueError, match="max_workers"):
        list(wu.multi_thread_safetensors_weights_iterator([p], False, max_workers=0))


def test_float8_on_old_torch(tmp_path, monkeypatch):
    """torch without float8 dtypes: a clear TypeError, or the raw bytes when asked."""
    p = _header_file(tmp_path / "f8.safetensors",
                     {"s": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]}}, bytes(range(6)))
    if hasattr(torch, "float8_e4m3fn"):
        t = dict(wu.safetensors_weights_iterator([p], False))["s"]
        assert t.dtype == torch.float8_e4m3fn and t.shape == (2, 3)
        return
    with pytest.raises(TypeError, match=r"f8\.safetensors: tensor 's': dtype F8_E4M3 has no torch"):
        list(wu.safetensors_weights_iterator([p], False))
    monkeypatch.setenv("WEIGHTLIFT_RAW_DTYPES", "1")
    t = dict(wu.safetensors_weights_iterator([p], False))["s"]
    assert t.dtype == torch.uint8 and t.shape == (2, 3, 1)
    assert t.reshape(-1).tolist() == list(range(6))


def test_corrupt_pt_file(tmp_path):
    p = tmp_path / "pytorch_model.bin"
    p.write_bytes(b"not a zip or pickle")
    # torch.load raises UnpicklingError; the C++ reader, where built, CorruptDataError (a ValueError).
    with pytest.raises((pickle.UnpicklingError, RuntimeError, ValueError)):
        list(wu.pt_weights_iterator([str(p)], False))


def test_malformed_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="index"):
        wu.filter_duplicate_safetensors_files([str(tmp_path / "a.safetensors")], str(tmp_path),
                                              "model.safetensors.index.json")


def test_unsafe_index_path(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(ValueError, match="unsafe path"):
        wu.filter_duplicate_safetensors_files([], str(tmp_path), "model.safetensors.index.json")


def test_save_file_refuses_shared_memory(tmp_path):
    w = torch.zeros(4)
    with pytest.raises(RuntimeError, match="share memory"):
        weightlift.save_file({"a": w, "b": w}, tmp_path / "x.safetensors")
    assert not os.path.exists(tmp_path / "x.safetensors")
