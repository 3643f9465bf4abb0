"""Port of vLLM's tests/model_executor/test_weight_utils.py (Hub download,
offline behaviour) plus the cases the anchors list for functions vLLM has no
unit tests for, written from the reference's documented behaviour."""
import hashlib
import logging
import os
import re
import socket
import tempfile

import pytest
import torch

import weightlift.weight_utils as mod
from weightlift import vllm_compat as wu

# ---- download_weights_from_hf --------------------------------------------------------------

def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def offline(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return hub


def test_download_offline_not_cached_raises(offline, tmp_path):
    from huggingface_hub.utils import LocalEntryNotFoundError

    with pytest.raises(LocalEntryNotFoundError):
        wu.download_weights_from_hf("facebook/opt-125m", allow_patterns=["*.safetensors", "*.bin"],
                                    cache_dir=str(tmp_path))


def test_download_index_offline_missing_is_not_an_error(offline, tmp_path):
    assert wu.download_safetensors_index_file_from_hf("facebook/opt-125m", "model.safetensors.index.json",
                                                      str(tmp_path)) is None


@pytest.mark.skipif(not _hub_reachable(), reason="needs huggingface.co")
def test_download_then_offline_cache_hit(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    wu.download_weights_from_hf("facebook/opt-125m", allow_patterns=["*.safetensors", "*.bin"],
                                cache_dir=str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert wu.download_weights_from_hf("facebook/opt-125m", allow_patterns=["*.safetensors", "*.bin"],
                                       cache_dir=str(tmp_path)) is not None


# ---- _natural_sort_key -------------------------------------------------------------------------

@pytest.mark.parametrize("path,key", [
    ("model-00001-of-00005.safetensors", ["model-", 1, "-of-", 5, ".safetensors"]),
    ("/a/b9/model-2.safetensors", ["model-", 2, ".safetensors"]),
    ("10.safetensors", ["", 10, ".safetensors"]),
    ("model.safetensors", ["model.safetensors"]),
    ("consolidated.00.safetensors", ["consolidated.", 0, ".safetensors"]),
])
def test_natural_sort_key(path, key):
    assert wu._natural_sort_key(path) == key


def test_natural_sort_order():
    assert sorted(["m-10", "m-2", "m-1"], key=wu._natural_sort_key) == ["m-1", "m-2", "m-10"]


# ---- maybe_remap_kv_scale_name --------------------------------------------------------------------

P = {"l.0.self_attn.attn.k_scale": 0, "l.0.self_attn.attn.v_scale": 0, "l.0.mlp.gate.weight": 0,
     "l.0.self_attn.attn.q_scale": 0, "l.0.mixer.attn.k_scale": 0, "l.0.attn.k_zero_point": 0}
MLA = {"l.0.self_attn.mla_attn.mla_attn.k_scale": 0, "l.0.self_attn.mla_attn.mla_attn.v_scale": 0}


@pytest.mark.parametrize("name,params,expected", [
    ("l.0.self_attn.k_proj.k_scale", P, "l.0.self_attn.attn.k_scale"),
    ("l.0.self_attn.v_proj.v_scale", P, "l.0.self_attn.attn.v_scale"),
    ("l.0.self_attn.k_proj.k_scale", MLA, "l.0.self_attn.mla_attn.mla_attn.k_scale"),
    ("l.0.self_attn.kv_scale", P, "l.0.self_attn.attn.k_scale"),
    ("l.0.self_attn.k_scale", P, "l.0.self_attn.attn.k_scale"),
    ("l.0.self_attn.qkv_proj.v_scale", P, "l.0.self_attn.attn.v_scale"),
    ("l.0.self_attn.qkqkv_proj.k_scale", P, "l.0.self_attn.attn.k_scale"),
    ("l.0.mixer.k_proj.k_scale", P, "l.0.mixer.attn.k_scale"),
    ("l.0.self_attn.q.scale", P, "l.0.self_attn.attn.q_scale"),
    ("l.0.self_attn.k_cache.scale", P, "l.0.self_attn.attn.k_scale"),
    ("l.0.k_zero_point", P, "l.0.attn.k_zero_point"),
    ("l.0.mlp.gate.weight", P, "l.0.mlp.gate.weight"),         # no remapping applies
    ("l.0.self_attn.attn.k_scale", P, "l.0.self_attn.attn.k_scale"),  # already the model's name
    ("l.9.self_attn.k_proj.k_scale", P, None),                  # target missing
    ("l.9.self_attn.kv_scale", P, None),
])
def test_maybe_remap_kv_scale_name(name, params, expected):
    assert wu.maybe_remap_kv_scale_name(name, params) == expected


# ---- MoE expert names -----------------------------------------------------------------------------------

def test_maybe_remap_moe_expert_param_name():
    params = {"layers.0.mlp.experts.routed_experts.w13_weight": 0,
              "layers.0.feed_forward.experts.routed_experts.w2_input_scale": 0}
    f = wu.maybe_remap_moe_expert_param_name
    assert f("layers.0.mlp.experts.w13_weight", params) == "layers.0.mlp.experts.routed_experts.w13_weight"
    assert f("layers.0.feed_forward.experts.w2_input_scale", params) == \
        "layers.0.feed_forward.experts.routed_experts.w2_input_scale"
    assert f("layers.0.mlp.experts.w2_weight", params) == "layers.0.mlp.experts.w2_weight"  # not in model
    assert f("layers.0.mlp.gate.weight", params) == "layers.0.mlp.gate.weight"  # not an expert
    assert f("layers.0.mlp.experts.routed_experts.w13_weight", params) == \
        "layers.0.mlp.experts.routed_experts.w13_weight"
    assert f("layers.0.mlp.experts.0.up_proj.weight", params) == "layers.0.mlp.experts.0.up_proj.weight"
    w = torch.zeros(1)
    out = list(wu.remap_moe_expert_weights([("layers.0.mlp.experts.w13_weight", w), ("x", w)], params))
    assert out[0][0] == "layers.0.mlp.experts.routed_experts.w13_weight" and out[0][1] is w
    assert out[1][0] == "x"


# ---- dummy weights ----------------------------------------------------------------------------------------

def test_dummy_weights():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    m.register_buffer("ids", torch.arange(5))
    wu.initialize_dummy_weights(m, None)
    sd = m.state_dict()
    assert torch.equal(sd["0.weight"], sd["1.weight"])  # same numel and dtype: same values
    for v in sd.values():
        if v.is_floating_point():
            assert v.min() >= -1e-3 and v.max() <= 1e-3
    assert torch.equal(sd["ids"], torch.arange(5))  # integer tensors untouched
    first = {k: v.clone() for k, v in sd.items()}
    wu.initialize_dummy_weights(m, None)
    assert all(torch.equal(first[k], v) for k, v in m.state_dict().items())
    p = torch.empty(4, dtype=torch.bfloat16)
    wu.initialize_single_dummy_weight(p, low=0.5, high=1.0, seed=3)
    assert (p >= 0.5).all() and (p <= 1.0).all()
    meta = torch.empty(3, device="meta")
    wu.initialize_single_dummy_weight(meta)  # skipped, no error


# ---- weight loaders ---------------------------------------------------------------------------------------

def test_default_weight_loader():
    p = torch.zeros(2, 3)
    w = torch.arange(6.0).view(2, 3)
    wu.default_weight_loader(p, w)
    assert torch.equal(p, w)
    s = torch.zeros(1)
    wu.default_weight_loader(s, torch.tensor(4.0))  # one element each: shapes may differ
    assert s.item() == 4.0
    with pytest.raises(AssertionError, match=re.escape("Attempted to load weight (torch.Size([3, 2])) "
                                                       "into parameter (torch.Size([2, 3]))")):
        wu.default_weight_loader(p, torch.zeros(3, 2))


def test_row_parallel_and_sharded_loaders(monkeypatch):
    full = torch.arange(24.0).view(4, 6)
    for rank in (0, 1):
        monkeypatch.setattr(mod, "get_tensor_model_parallel_rank", lambda r=rank: r)
        p = torch.zeros(2, 6)
        wu.row_parallel_weight_loader(p, full)
        assert torch.equal(p, full[2 * rank:2 * rank + 2])
        q = torch.zeros(4, 3)
        wu.sharded_weight_loader(1)(q, full)
        assert torch.equal(q, full[:, 3 * rank:3 * rank + 3])
        b = torch.zeros(6)
        wu.row_parallel_weight_loader(b, torch.arange(6.0))  # 1-D: not sharded
        assert torch.equal(b, torch.arange(6.0))


def test_composed_weight_loader():
    p = torch.zeros(3)
    wu.composed_weight_loader(wu.default_weight_loader, lambda x: x * 2)(p, torch.ones(3))
    assert torch.equal(p, torch.full((3,), 2.0))


def test_weight_loader_fills_from_iterator(tmp_path):
    """The iterators' tensors feed the loaders: a model's params filled in place."""
    from safetensors.torch import save_file

    m = torch.nn.Linear(4, 3)
    src = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    save_file(src, str(tmp_path / "model.safetensors"))
    params = dict(m.named_parameters())
    for name, w in wu.safetensors_weights_iterator([str(tmp_path / "model.safetensors")], False):
        wu.default_weight_loader(params[name], w)
    assert all(torch.equal(params[k].data, src[k]) for k in src)


# ---- files, locks, atomic writes -------------------------------------------------------------------------------

def test_filter_files_not_needed_for_inference():
    files = ["/m/model.bin", "/m/training_args.bin", "/m/optimizer.bin", "/m/optimizer.pt", "/m/scheduler.pt",
             "/m/scaler.pt", "/m/model.pt"]
    assert wu.filter_files_not_needed_for_inference(files) == ["/m/model.bin", "/m/model.pt"]


def test_get_lock(tmp_path):
    cache = str(tmp_path / "cache")
    os.makedirs(cache)
    lock = wu.get_lock("org/model", cache)
    name = "org-model"
    assert lock.lock_file == os.path.join(cache, hashlib.sha256(name.encode()).hexdigest() + name + ".lock")
    with lock:
        assert os.path.exists(lock.lock_file)
    assert os.path.dirname(wu.get_lock("x").lock_file) == tempfile.gettempdir()
    # The engine's lock (weightlift download, the C++ Hub client) is the same file.
    from weightlift import _core

    assert _core.model_lock_path("org/model", cache) == lock.lock_file


def test_atomic_writer(tmp_path, caplog):
    p = tmp_path / "f.json"
    p.write_text("old")
    with wu.atomic_writer(p) as f:
        f.write("new")
    assert p.read_text() == "new"
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="boom"):
        with wu.atomic_writer(p) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert p.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["f.json"]  # no temporary left behind
    with wu.atomic_writer(tmp_path / "b.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


def test_get_fs_type(tmp_path):
    assert wu._get_fs_type([]) == ""
    mounts = {}
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mounts[parts[1]] = parts[2]
    assert wu._get_fs_type(["/"]) == mounts["/"]
    assert wu._get_fs_type([str(tmp_path)]) in mounts.values()


# ---- auto prefetch (the reference's selection rule) ----------------------------------------------------------------

@pytest.mark.parametrize("fs,strategy,mult,expected", [
    ("nfs", None, 2, True), ("lustre", None, 2, True), ("nfs4", None, 1, False),
    ("nfs", "lazy", 2, False), ("ext4", None, 2, False), ("ext4", "prefetch", 2, True),
])
def test_auto_prefetch_selection(tmp_path, monkeypatch, fs, strategy, mult, expected):
    from safetensors.torch import save_file

    p = str(tmp_path / "model.safetensors")
    save_file({"weight": torch.ones(2)}, p)
    size = os.path.getsize(p)
    calls = []
    monkeypatch.setattr(mod, "_get_fs_type", lambda files: fs)
    monkeypatch.setattr(mod, "_get_available_ram_bytes", lambda: size * mult)
    monkeypatch.setattr(mod, "_prefetch_all_checkpoints", lambda *a, **k: calls.append((a, k)))
    out = dict(wu.safetensors_weights_iterator([p], False, strategy))
    assert bool(calls) is expected
    if expected:
        assert calls == [(([p],), {"num_prefetch_threads": 8, "block_size": 16 * 1024 * 1024})]
    assert torch.equal(out["weight"], torch.ones(2))


def test_prefetch_reads_files(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"x" * 100)
    wu._prefetch_checkpoint(str(p), block_size=7)
    with pytest.raises(ValueError, match="block size"):
        wu._prefetch_checkpoint(str(p), block_size=0)
    with pytest.raises(ValueError, match="num threads"):
        wu._prefetch_all_checkpoints([str(p)], num_prefetch_threads=0)


def test_enable_tqdm():
    assert wu.enable_tqdm(True) is True  # torch.distributed not initialised: rank 0
    assert wu.enable_tqdm(False) is False


def test_progress_bar_format(tmp_path, capsys):
    from safetensors.torch import save_file

    files = []
    for i in range(2):
        files.append(str(tmp_path / f"model-{i}.safetensors"))
        save_file({f"w{i}": torch.zeros(2)}, files[-1])
    list(wu.safetensors_weights_iterator(files, True))
    err = capsys.readouterr().err
    assert "Loading safetensors checkpoint shards: 100% Completed | 2/2" in err
    list(wu.safetensors_weights_iterator(files, False))
    assert capsys.readouterr().err == ""


def test_progress_bar_only_on_rank_0(tmp_path, capsys, monkeypatch):
    from safetensors.torch import save_file

    p = str(tmp_path / "model.safetensors")
    save_file({"w": torch.zeros(2)}, p)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    for rank, shown in ((1, False), (0, True)):
        monkeypatch.setattr(torch.distributed, "get_rank", lambda r=rank: r)
        assert wu.enable_tqdm(True) is shown
        list(wu.safetensors_weights_iterator([p], True, "lazy"))
        list(wu.pt_weights_iterator([], True))
        assert ("Loading safetensors checkpoint shards" in capsys.readouterr().err) is shown
