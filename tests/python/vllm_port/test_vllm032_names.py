"""The names vLLM 0.32's weight_utils has beyond the reference
(weightlift._vllm_extras, exported by weightlift.vllm_compat): their
behaviour, as vLLM 0.32's own code has it (tests/vllm/test_vllm_names.py
checks the same answers against the installed vLLM)."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
from dataclasses import dataclass, field

import pytest
import torch
from safetensors.torch import save_file

from weightlift.vllm_compat import (
    DisabledTqdm,
    drop_checkpoint_cache,
    filter_mm_encoder_only_safetensors_files,
    filter_safetensors_files_by_weight_name,
    resolve_mm_encoder_only_lm_prefixes,
)


@dataclass
class Mapper:
    """The part of vLLM's WeightsMapper these functions use."""

    orig_to_new_prefix: dict = field(default_factory=dict)

    def map_name(self, key):
        for old, new in self.orig_to_new_prefix.items():
            if key.startswith(old):
                return None if new is None else new + key[len(old):]
        return key


def _shards(tmp_path, layout: dict[str, list[str]], index=True):
    for file, names in layout.items():
        save_file({n: torch.zeros(2) for n in names}, tmp_path / file)
    if index:
        weight_map = {n: f for f, names in layout.items() for n in names}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return [str(tmp_path / f) for f in layout]


def test_disabled_tqdm_never_draws(capsys):
    bar = DisabledTqdm(range(3), desc="x", disable=False)
    assert bar.disable and list(bar) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_filter_by_weight_name(tmp_path):
    files = _shards(tmp_path, {"a.safetensors": ["vision.w", "lm.w"], "b.safetensors": ["vision.x"],
                               "c.safetensors": ["lm.y"]}, index=False)
    unused = lambda n: n.startswith("vision.")  # noqa: E731
    assert filter_safetensors_files_by_weight_name(files, unused) == [files[0], files[2]]
    # Nothing wanted anywhere: the list unchanged (the model then fails as vLLM's would).
    assert filter_safetensors_files_by_weight_name(files, lambda n: True) == files
    assert filter_safetensors_files_by_weight_name(files, lambda n: False) == files


def test_resolve_lm_prefixes():
    assert resolve_mm_encoder_only_lm_prefixes(None) is None
    assert resolve_mm_encoder_only_lm_prefixes([]) is None
    assert resolve_mm_encoder_only_lm_prefixes(["language_model", "lm_head."]) == ("language_model.", "lm_head.")
    # A mapper whose non-LM roots lie elsewhere: fine.
    m = Mapper({"model.visual.": "visual.", "model.language_model.": "language_model.model."})
    assert resolve_mm_encoder_only_lm_prefixes(["language_model"], weights_mapper=m) == ("language_model.",)
    # The LM prefix is also the checkpoint root of vision weights (Molmo, Phi-4-MM): fail closed.
    m = Mapper({"model.vision_backbone.": "vision_backbone.", "model.": "model."})
    assert resolve_mm_encoder_only_lm_prefixes(["model"], weights_mapper=m) is None


def test_filter_encoder_only_shards(tmp_path):
    layout = {"model-1.safetensors": ["language_model.a", "language_model.b"],
              "model-2.safetensors": ["language_model.c", "visual.d"],
              "model-3.safetensors": ["visual.e"]}
    files = _shards(tmp_path, layout)
    extra = tmp_path / "extra.safetensors"  # a file the index does not list is kept
    save_file({"language_model.z": torch.zeros(1)}, extra)
    files.append(str(extra))
    idx = "model.safetensors.index.json"
    got = filter_mm_encoder_only_safetensors_files(files, str(tmp_path), idx, ("language_model.",))
    assert got == files[1:]
    assert filter_mm_encoder_only_safetensors_files(files, str(tmp_path), idx, ()) == files
    assert filter_mm_encoder_only_safetensors_files(files, str(tmp_path), "missing.json", ("language_model.",)) == files
    # Through a mapper: checkpoint 'model.*' is the LM under 'language_model.model.*'; a key it drops is not LM.
    layout = {"s1.safetensors": ["model.layers.0.w"], "s2.safetensors": ["model.layers.1.w", "dropped.w"],
              "s3.safetensors": ["vision.w"]}
    sub = tmp_path / "mapped"
    sub.mkdir()
    files = _shards(sub, layout)
    m = Mapper({"model.": "language_model.model.", "dropped.": None})
    got = filter_mm_encoder_only_safetensors_files(files, str(sub), idx, ("language_model.",), weights_mapper=m)
    assert got == files[1:]


def _resident_pages(path) -> int:
    """Pages of `path` in the page cache (mincore over a private mapping that touches nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        try:
            anchor = ctypes.c_char.from_buffer(m)
            rc = libc.mincore(ctypes.addressof(anchor), size, vec)
            del anchor
        finally:
            m.close()
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec)


def test_drop_checkpoint_cache_evicts_a_local_folders_safetensors(tmp_path):
    files = _shards(tmp_path, {"model.safetensors": ["w"]}, index=False)
    big = {"w": torch.ones(4 << 20, dtype=torch.uint8)}
    save_file(big, files[0])
    other = tmp_path / "notes.bin"
    other.write_bytes(b"x" * (1 << 20))
    for p in (files[0], other):
        with open(p, "rb") as f:
            os.fsync(f.fileno())
            f.read()
    assert _resident_pages(files[0]) > 0
    drop_checkpoint_cache(str(tmp_path))
    assert _resident_pages(files[0]) == 0
    assert _resident_pages(other) > 0  # only *.safetensors


def test_drop_checkpoint_cache_of_an_unknown_model_only_logs(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level("INFO", logger="weightlift"):
        drop_checkpoint_cache("no-such-org/no-such-model", cache_dir=str(tmp_path))
    assert "No local checkpoint found for no-such-org/no-such-model" in caplog.text


@pytest.mark.parametrize("name", ["filter_safetensors_files_by_weight_name", "filter_mm_encoder_only_safetensors_files",
                                  "resolve_mm_encoder_only_lm_prefixes", "drop_checkpoint_cache", "DisabledTqdm"])
def test_exported_by_both_namespaces(name):
    import weightlift.vllm_compat as compat
    import weightlift.weight_utils as wu

    assert getattr(compat, name) is getattr(wu, name)
