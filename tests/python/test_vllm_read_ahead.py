"""The plug-in's read-ahead decisions (vllm_plugin/_read_ahead.py), without
vLLM: a local folder starts an engine read-ahead over the loader's file
choice (with the expert filter), the option, a Hub repository id, npcache
and object storage at TP > 1 start none, a failure to start is logged and
the load goes on; the overlap figures at placement; stop and close."""
from __future__ import annotations

import logging
import types

import pytest
import torch
from safetensors.torch import save_file

from weightlift.vllm_plugin import _read_ahead
from weightlift.vllm_plugin._options import Options


class FakeLoader:
    """What _read_ahead.start asks of a WeightliftModelLoader."""

    def __init__(self, location, files, options=None, experts=None):
        self.options = options or Options()
        self._location, self._files = location, files
        self.local_expert_ids = None
        self._experts = experts
        self.load_config = types.SimpleNamespace(pt_load_map_location=None)
        self.prepared = 0

    def _weights_location(self, model_config):
        return self._location

    def _prepare_weights(self, location, subfolder, revision, fall_back, overrides):
        self.prepared += 1
        return location, self._files, True, "model.safetensors.index.json"

    def _init_ep_weight_filter(self, model_config):
        self.local_expert_ids = self._experts


CONFIG = types.SimpleNamespace(revision=None)


@pytest.fixture()
def folder(tmp_path):
    g = torch.Generator().manual_seed(1)
    save_file({"model.layers.0.mlp.experts.0.w1.weight": torch.randn(128, 64, generator=g),
               "model.layers.0.mlp.experts.1.w1.weight": torch.randn(128, 64, generator=g),
               "lm_head.weight": torch.randn(256, 64, generator=g)}, tmp_path / "model.safetensors")
    return tmp_path, [str(tmp_path / "model.safetensors")]


def test_a_local_folder_is_read_ahead_with_the_expert_filter(folder, caplog):
    path, files = folder
    loader = FakeLoader(str(path), files, experts={1})
    early = _read_ahead.start(loader, CONFIG)
    assert early is not None and not early.remote and early.files == files
    assert early.job.wait() == ""
    assert early.covers_everything()
    with caplog.at_level(logging.INFO, logger="weightlift.vllm"):
        p = early.placement_starts()
    assert p["bytes_planned"] == (128 * 64 + 256 * 64) * 4  # expert 0 is another rank's
    assert p["bytes_read"] + p["bytes_cached"] == p["bytes_planned"]
    assert "Read ahead while the model was built" in caplog.text
    assert early.engine_options() == {}  # local: the page cache serves the load
    early.close()
    early.close()  # twice is fine


def test_where_no_read_ahead_starts(folder):
    path, files = folder
    assert _read_ahead.start(FakeLoader(str(path), files, Options(read_ahead=False)), CONFIG) is None
    assert _read_ahead.start(FakeLoader(str(path), files, Options(format="npcache")), CONFIG) is None
    hub = FakeLoader("org/model", files)  # a Hub id: loaded while it downloads already
    assert _read_ahead.start(hub, CONFIG) is None and hub.prepared == 0
    s3 = FakeLoader("s3://bucket/model", ["s3://bucket/model/model.safetensors"])
    assert _read_ahead.start(s3, CONFIG, tp_size=2) is None and s3.prepared == 0


def test_a_failure_to_start_is_logged_and_the_load_goes_on(folder, caplog):
    path, _ = folder
    loader = FakeLoader(str(path), [])  # no files: the engine refuses
    with caplog.at_level(logging.INFO, logger="weightlift.vllm"):
        assert _read_ahead.start(loader, CONFIG) is None
    assert "read-ahead not started" in caplog.text


def test_first_touch_queues_host_parameters_as_they_are_registered():
    touch = _read_ahead.FirstTouch()
    with touch:
        big = torch.nn.Linear(1024, 1024, bias=False)  # 4 MiB: queued where torch has the hook (>= 2.0)
    torch.nn.Linear(1024, 1024)  # after the block: not seen
    got = touch.stop()
    hooked = hasattr(torch.nn.modules.module, "register_module_parameter_registration_hook")
    assert got["bytes_queued"] == (big.weight.numel() * 4 if hooked else 0)
    assert got["bytes_done"] <= got["bytes_queued"]
    assert touch.stop() == {}
