"""The plug-in's read-ahead decisions (vllm_plugin/_read_ahead.py), without
vLLM: a local folder starts an engine read-ahead over the loader's file
choice (with the expert filter), the option, a Hub repository id, npcache
and object storage at TP > 1 start none, a failure to start is logged and
the load goes on; the overlap figures at placement; stop and close."""
from __future__ import annotations

import logging
import threading
import time
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
    # Asked at once (a model built before the headers were read): waits for the plan.
    assert early.covers_everything()
    planned = early.job.wait_planned()
    assert planned["planned"] and planned["bytes_capped"] == 0
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


class Llama:
    """A model class as vLLM's registry gives it: what it stacks."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture()
def llama(tmp_path):
    g = torch.Generator().manual_seed(2)
    t = {f"model.layers.0.{m}.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16)
         for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj")}
    t["lm_head.weight"] = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    save_file(t, tmp_path / "model.safetensors")
    return tmp_path, [str(tmp_path / "model.safetensors")], t


def _until_done(early, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not early.progress()["done"]:
        assert time.monotonic() < deadline, early.progress()
        time.sleep(0.01)
    return early.progress()


@pytest.fixture()
def asked(monkeypatch):
    """The engine read-ahead's arguments, recorded (the job still starts)."""
    calls = []
    real = _read_ahead.read_ahead

    def recording(files, **kw):
        calls.append(kw)
        return real(files, **kw)

    monkeypatch.setattr(_read_ahead, "read_ahead", recording)
    return calls


def test_what_the_load_copies_is_read_ahead_first(llama, monkeypatch, asked):
    """_copied_first: the stacked tensors (the model class's
    packed_modules_mapping), which load_weights copies, are the engine job's
    first pass; the rest (mapped, needed by the end of load_model) follow in
    the same job."""
    path, files, t = llama
    monkeypatch.setattr(_read_ahead, "_model_class", lambda cfg: Llama)
    early = _read_ahead.start(FakeLoader(str(path), files), CONFIG)
    stacked = {n for n in t if any(p in n for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))}
    assert len(asked) == 1 and set(asked[0]["first"]) == stacked
    p = _until_done(early)
    assert p["bytes_planned"] == sum(x.numel() * 2 for x in t.values())
    assert p["bytes_read"] + p["bytes_cached"] == p["bytes_planned"] and early.covers_everything()
    early.close()


def test_at_tp_above_1_the_vocabulary_parallel_tensors_come_second(llama, asked):
    """TP > 1: row-parallel layers (o_proj, down_proj: split on dim 1) are
    copied too; what is mapped is the vocabulary-parallel embedding / LM head
    (first dimension the config's vocabulary size)."""
    path, files, t = llama
    cfg = types.SimpleNamespace(revision=None, get_vocab_size=lambda: 128)
    early = _read_ahead.start(FakeLoader(str(path), files), cfg, tp_size=2)
    assert set(asked[-1]["first"]) == set(t) - {"lm_head.weight"}
    assert _until_done(early)["bytes_planned"] == sum(x.numel() * 2 for x in t.values())
    early.close()
    # No vocabulary size to tell them by: one pass.
    early = _read_ahead.start(FakeLoader(str(path), files), CONFIG, tp_size=2)
    assert asked[-1]["first"] is None
    early.close()


@pytest.mark.parametrize("why", ["no class", "nothing stacked"])
def test_one_pass_in_file_order_otherwise(llama, monkeypatch, asked, why):
    path, files, t = llama
    monkeypatch.setattr(_read_ahead, "_model_class", (lambda cfg: 1 / 0) if why == "no class" else (lambda cfg: object))
    early = _read_ahead.start(FakeLoader(str(path), files), CONFIG)
    assert asked[-1]["first"] is None
    assert _until_done(early)["bytes_planned"] == sum(x.numel() * 2 for x in t.values())
    early.close()


def test_a_tight_bound_keeps_the_order_and_leaves_the_rest_to_the_load(llama, monkeypatch, asked):
    """The page-cache bound admits the first pass first (the engine's one
    bound; nothing restated here): what is left is the load's."""
    path, files, t = llama
    monkeypatch.setattr(_read_ahead, "_model_class", lambda cfg: Llama)
    early = _read_ahead.start(FakeLoader(str(path), files, Options(max_memory=4 * 64 * 64 * 2)), CONFIG)
    assert asked[-1]["first"] and asked[-1]["max_memory"] == 4 * 64 * 64 * 2
    p = _until_done(early)
    assert p["bytes_capped"] > 0 and not early.covers_everything()
    early.close()


class BlockedJob:
    """A read-ahead job that runs until stopped."""

    def __init__(self):
        self.stopped = threading.Event()

    def wait(self):
        self.stopped.wait()
        return ""

    def stop(self):
        self.stopped.set()

    def progress(self):
        return {"bytes_planned": 10, "bytes_cached": 0, "bytes_read": 5, "bytes_capped": 0, "bytes_consumed": 0,
                "planned": True, "done": self.stopped.is_set(), "remote": False, "seconds": 0.1}


def test_close_stops_the_job_and_what_it_did_stays_told():
    job = BlockedJob()
    early = _read_ahead.EarlyReads(job, [], False)
    p = early.progress()
    assert not p["done"] and p["bytes_read"] == 5
    early.close()
    assert job.stopped.is_set() and early.job is None
    assert early.progress() == {}  # closed before placement: nothing to tell
    early.close()  # twice: nothing more

