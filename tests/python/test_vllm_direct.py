"""The plug-in's straight-into-parameters rules (weightlift.vllm_plugin._direct)
without vLLM: a toy model whose loaders do what vLLM's do (name mapping with
stacked q/k/v and gate/up shards, TP slicing by narrow, a padded vocabulary,
a dtype change, a transposing loader, tied embeddings) loads a safetensors
checkpoint through the plan + the engine + stand-ins, and must end with
parameters byte-identical to its own plain load, at TP 1 and on each rank of TP 2."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from weightlift import _core
from weightlift._engine import open_stream
from weightlift._engine import options as engine_options
from weightlift._tensors import TORCH_DTYPES, TORCH_TO_NAME, to_torch
from weightlift.vllm_plugin import _direct

H, V, VPAD, Q, KV, F = 8, 20, 24, 8, 4, 12


class Mapper:
    """vLLM 0.32's WeightsMapper for stacked weights: (name, shard id)."""

    stacked = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
               ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}

    def _map_name_with_shard(self, key):
        if "rotary_emb.inv_freq" in key:
            return None
        for s, (new, sid) in self.stacked.items():
            if s in key:
                return key.replace(s, new, 1), sid
        return key, None


def _param(shape, dtype, **attrs):
    p = torch.nn.Parameter(torch.full(shape, -7, dtype=dtype), requires_grad=False)
    for k, v in attrs.items():
        setattr(p, k, v)
    return p


class Toy(torch.nn.Module):
    hf_to_vllm_mapper = Mapper()

    def __init__(self, tp_rank=0, tp_size=1, tied=False):
        super().__init__()
        self.r, self.w = tp_rank, tp_size
        bf = torch.bfloat16
        vocab_rows = (VPAD if tp_size == 1 else V) // tp_size
        self.embed = _param((vocab_rows, H), bf, output_dim=0, weight_loader=self.vocab_loader)
        self.qkv = _param(((Q + 2 * KV) // tp_size, H), bf, output_dim=0, weight_loader=self.qkv_loader)
        self.gate_up = _param((2 * F // tp_size, H), bf, output_dim=0, weight_loader=self.merged_loader)
        self.o = _param((H, Q // tp_size), bf, input_dim=1, weight_loader=self.row_loader)
        self.norm = _param((H,), bf)                       # float32 in the checkpoint
        self.conv = _param((H, H), bf, weight_loader=self.transposing_loader)  # GPT-2's Conv1D
        self.bias = _param((H,), bf)
        self.colb = _param((F // tp_size,), bf, output_dim=0, weight_loader=self.column_loader)  # float32 on disk
        self.lm_head = self.embed if tied else _param((vocab_rows, H), bf, output_dim=0,
                                                      weight_loader=self.vocab_loader)
        self.names = {"model.embed_tokens.weight": self.embed, "model.layers.0.self_attn.qkv_proj.weight": self.qkv,
                      "model.layers.0.mlp.gate_up_proj.weight": self.gate_up,
                      "model.layers.0.self_attn.o_proj.weight": self.o, "model.norm.weight": self.norm,
                      "model.layers.0.conv.weight": self.conv, "model.layers.0.bias": self.bias,
                      "model.layers.0.mlp.colb": self.colb,
                      "lm_head.weight": self.lm_head}
        self.tied = tied

    # named_parameters() under the checkpoint's module names
    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        for n, p in self.names.items():
            if remove_duplicate and id(p) in seen:
                continue
            seen.add(id(p))
            yield n, p

    def vocab_loader(self, param, w):
        rows = V // self.w
        w = w.narrow(0, self.r * rows, rows)
        param[: w.shape[0]].data.copy_(w)
        param[w.shape[0]:].data.fill_(0)

    def qkv_loader(self, param, w, shard_id):
        sizes = {"q": Q // self.w, "k": KV // self.w, "v": KV // self.w}
        off = {"q": 0, "k": sizes["q"], "v": sizes["q"] + sizes["k"]}[shard_id]
        pd = param.data.narrow(0, off, sizes[shard_id])
        w = w.narrow(0, self.r * sizes[shard_id], sizes[shard_id])
        assert pd.shape == w.shape
        pd.copy_(w)

    def merged_loader(self, param, w, shard_id):
        size = F // self.w
        param.data.narrow(0, shard_id * size, size).copy_(w.narrow(0, self.r * size, size))

    def column_loader(self, param, w):
        size = param.data.shape[0]
        param.data.copy_(w.narrow(0, self.r * size, size))

    def row_loader(self, param, w):
        size = param.data.shape[1]
        w = w.narrow(1, self.r * size, size)
        param.data.copy_(w)

    def transposing_loader(self, param, w):
        param.data.copy_(w.t())

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            r = self.hf_to_vllm_mapper._map_name_with_shard(name)
            if r is None:
                continue
            pname, sid = r
            if self.tied and pname == "lm_head.weight":
                continue  # as Llama skips it when tied
            p = self.names[pname]
            loader = getattr(p, "weight_loader", None)
            if loader is None:
                p.data.copy_(w)  # default_weight_loader (with the dtype change)
            elif sid is None:
                loader(p, w)
            else:
                loader(p, w, sid)
            loaded.add(pname)
        return loaded


def _checkpoint(tmp_path, with_lm_head=True):
    g = torch.Generator().manual_seed(3)
    bf = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    t = {"model.embed_tokens.weight": bf(V, H), "model.layers.0.self_attn.q_proj.weight": bf(Q, H),
         "model.layers.0.self_attn.k_proj.weight": bf(KV, H), "model.layers.0.self_attn.v_proj.weight": bf(KV, H),
         "model.layers.0.mlp.gate_proj.weight": bf(F, H), "model.layers.0.mlp.up_proj.weight": bf(F, H),
         "model.layers.0.self_attn.o_proj.weight": bf(H, Q), "model.norm.weight": torch.randn(H, generator=g),
         "model.layers.0.conv.weight": bf(H, H), "model.layers.0.bias": bf(H),
         "model.layers.0.mlp.colb": torch.randn(F, generator=g),
         "model.layers.0.rotary_emb.inv_freq": torch.randn(4, generator=g)}
    if with_lm_head:
        t["lm_head.weight"] = bf(V, H)
    names = sorted(t)
    save_file({n: t[n] for n in names[:6]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: t[n] for n in names[6:]}, tmp_path / "model-00002-of-00002.safetensors")
    return sorted(str(p) for p in tmp_path.glob("*.safetensors")), t


def _plain(files):
    for f in files:
        for name, file, dtype, shape, data in open_stream([f], max_queued_bytes=1 << 30, strategy="lazy"):
            yield name, to_torch(dtype, shape, data, name, file).clone()


def _via_plan(model, files, tp_rank, tp_size):
    listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
    file_of = {n: f for f in files for n, _, _ in _core.list_tensors([f])}
    plan = _direct.make_plan(model, listed, tp_rank, tp_size)

    def read(name):
        return next(to_torch(d, s, b, n, fl) for n, fl, d, s, b in
                    open_stream([file_of[name]], max_queued_bytes=1 << 30, only=[name], strategy="lazy"))

    mat = _direct.Materializer(read)
    items = [(n, pl.region.data_ptr(), pl.nbytes, TORCH_TO_NAME[pl.dtype], list(pl.shard_shape))
             for n, pl in plan.placements.items()]
    rules = plan.shard_rules(plan.placements)
    opts = dict(tp_rank=tp_rank, tp_size=tp_size) if tp_size > 1 else {}
    _core.load_into(files, engine_options(strategy="stream", shard_rules=rules or None, **opts), items)

    def weights():
        for n, pl in plan.placements.items():
            yield n, _direct.PlannedTensor(pl, mat)
        rest = [n for n, _, _ in listed if n not in plan.placements]
        rules2 = plan.shard_rules(rest)
        for name, file, dtype, shape, data in open_stream(files, max_queued_bytes=1 << 30, ordered=True,
                                                          exclude=list(plan.placements) or None, strategy="lazy",
                                                          shard_rules=rules2 or None, **opts):
            t = to_torch(dtype, shape, data, name, file)
            if name in plan.sharded:
                full = next(s for n, _, s in listed if n == name)
                t = _direct.sharded_standin(name, t.dtype, full, plan.sharded[name], t, mat)
            yield name, t

    loaded = model.load_weights(weights())
    return plan, mat, loaded


def _state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_planned_load_equals_the_models_own(tmp_path, tp_size, tied):
    files, _ = _checkpoint(tmp_path, with_lm_head=not tied)
    for rank in range(tp_size):
        ref = Toy(rank, tp_size, tied)
        ref.load_weights(_plain(files))
        ours = Toy(rank, tp_size, tied)
        plan, mat, loaded = _via_plan(ours, files, rank, tp_size)
        a, b = _state(ref), _state(ours)
        assert a.keys() == b.keys()
        for n in a:
            assert torch.equal(a[n].view(torch.int16) if a[n].dtype == torch.bfloat16 else a[n],
                               b[n].view(torch.int16) if b[n].dtype == torch.bfloat16 else b[n]), (n, rank)
        # What went straight in: q/k/v and gate/up parts, o_proj, the embedding (padded at TP 1), the
        # conv weight (planned: same name, shape, dtype), the bias; not the float32 norm, not lm_head when tied.
        placed = set(plan.placements)
        assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                "model.embed_tokens.weight", "model.layers.0.bias"} <= placed
        assert "model.norm.weight" not in placed and "model.layers.0.mlp.colb" not in placed
        # At TP 2 the float32 column tensor is read as this rank's shard only.
        assert plan.sharded == ({"model.layers.0.mlp.colb": (0, rank * F // 2, F // 2)} if tp_size == 2 else {})
        assert ("lm_head.weight" in placed) == (not tied)
        # Every placement but the transposed one was confirmed by the model's own copy; the transposed
        # one was read again and written by the model (never a wrong byte).
        loose, clashing = _direct.check_placements(plan, mat)
        assert not loose and not clashing
        unconfirmed = {n for n, p in plan.placements.items() if not p.confirmed}
        if tp_size == 1:
            assert unconfirmed == {"model.layers.0.conv.weight"}
            assert mat.names == ["model.layers.0.conv.weight"]
            assert plan.placements["model.layers.0.conv.weight"].written
        else:  # conv is not split, so not placed differently; it still transposes
            assert "model.layers.0.conv.weight" in unconfirmed


def test_stand_in_metadata_and_operations(tmp_path):
    files, t = _checkpoint(tmp_path)
    model = Toy()
    listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
    plan = _direct.make_plan(model, listed)
    reads = []

    def read(name):
        reads.append(name)
        return t[name].clone()

    mat = _direct.Materializer(read)
    pl = plan.placements["model.layers.0.self_attn.o_proj.weight"]
    s = _direct.PlannedTensor(pl, mat)
    assert s.shape == (H, Q) and s.dtype == torch.bfloat16 and s.dim() == 2 and s.numel() == H * Q
    assert s.is_contiguous() and s.size(0) == H and len(s) == H and not reads
    assert s.to(torch.bfloat16) is s and s.contiguous() is s and s.view(H, Q) is s and s.narrow(1, 0, Q) is s
    assert s[:, :] is s and isinstance(s.detach(), _direct.PlannedTensor)
    s.shard_id = 3  # vLLM's mapper tags tensors
    assert s.shard_id == 3 and not reads
    # Arithmetic, a dtype change, a slice of part of it: the real bytes, read once per stand-in.
    assert torch.equal((s * 2).float(), t["model.layers.0.self_attn.o_proj.weight"].float() * 2)
    assert torch.equal(s.float(), t["model.layers.0.self_attn.o_proj.weight"].float())
    assert torch.equal(s[1:3], t["model.layers.0.self_attn.o_proj.weight"][1:3])
    assert reads == ["model.layers.0.self_attn.o_proj.weight"] and mat.count == 1
    # An in-place change sticks to the stand-in (it is its real tensor from then on).
    s.mul_(0)
    assert torch.count_nonzero(s.float()) == 0


def test_a_placement_the_model_skips_is_reported_and_an_overlap_fails(tmp_path):
    files, _ = _checkpoint(tmp_path)
    model = Toy()
    listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
    plan = _direct.make_plan(model, listed)
    # Nothing consumed: every placement is loose, none clashes.
    loose, clashing = _direct.check_placements(plan)
    assert {p.name for p in loose} == set(plan.placements) and not clashing
    # One confirmed, another planned over the same bytes and never confirmed: a clash.
    q = plan.placements["model.layers.0.self_attn.q_proj.weight"]
    q.confirmed = True
    plan.placements["fake"] = _direct.Placement("fake", q.dtype, q.full_shape, q.param_name, q.region)
    loose, clashing = _direct.check_placements(plan)
    assert [p.name for p in clashing] == ["fake"]


def test_parameters_elsewhere_or_shared_are_left_to_the_model(tmp_path):
    files, _ = _checkpoint(tmp_path)
    model = Toy()
    listed = [(n, TORCH_DTYPES[d], tuple(s)) for n, d, s in _core.list_tensors(files)]
    # Not host memory of the wanted kind (e.g. CUDA parameters seen from a CPU plan), or no memory at all
    # (meta parameters of online quantization): nothing planned.
    assert not _direct.make_plan(model, listed, device_type="cuda").placements
    meta = Toy()
    for n in list(meta.names):
        meta.names[n] = _param(tuple(meta.names[n].shape), meta.names[n].dtype).to("meta")
    assert not _direct.make_plan(meta, listed, device_type="meta").placements
    assert not _direct.make_plan(meta, listed).placements
    # Two checkpoint tensors into one parameter (an untied checkpoint into tied parameters): neither.
    tied = Toy(tied=True)
    plan = _direct.make_plan(tied, listed)
    assert "model.embed_tokens.weight" not in plan.placements and "lm_head.weight" not in plan.placements
    # TP 2 with a padded vocabulary split unevenly: not planned (the model's own slice differs).
    odd = Toy(0, 2)
    odd.embed = odd.names["model.embed_tokens.weight"] = _param((VPAD // 2, H), torch.bfloat16, output_dim=0)
    plan = _direct.make_plan(odd, listed, 0, 2)
    assert "model.embed_tokens.weight" not in plan.placements


def test_a_pytorch_bin_checkpoint_goes_the_same_way(tmp_path):
    """vLLM's .bin fallback: the engine's PyTorch reader feeds the same plan (straight into the
    parameters, stand-ins, the rest through the model)."""
    st_dir = tmp_path / "st"
    st_dir.mkdir()
    files, tensors = _checkpoint(st_dir)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    names = sorted(tensors)
    torch.save({n: tensors[n] for n in names[:6]}, bin_dir / "pytorch_model-00001-of-00002.bin")
    torch.save({n: tensors[n] for n in names[6:]}, bin_dir / "pytorch_model-00002-of-00002.bin")
    bins = sorted(str(p) for p in bin_dir.glob("*.bin"))
    ref = Toy()
    ref.load_weights(_plain(files))
    ours = Toy()
    plan, mat, _ = _via_plan(ours, bins, 0, 1)
    a, b = _state(ref), _state(ours)
    for n in a:
        assert torch.equal(a[n].float(), b[n].float()), n
    assert len(plan.placements) >= 8
    loose, clashing = _direct.check_placements(plan, mat)
    assert not loose and not clashing


class _Quant:
    def __init__(self, transforms=(), fail=False):
        self.transforms, self.fail = list(transforms), fail

    def get_checkpoint_weight_mapper(self):
        if self.fail:
            raise RuntimeError("no mapper")
        return type("M", (), {"weights_transforms": self.transforms})()


def test_tensors_the_weights_transforms_touch():
    """vLLM 0.34's WeightsMapper.weights_transforms rewrite the stream before the
    name mapping: what they rename, rewrite, drop, hold back or read is left to the model."""
    tensors = [(n, torch.bfloat16, (4, 4)) for n in ("a", "b", "c", "d", "e", "f")]

    def rename(ws):
        for n, t in ws:
            yield ("b2" if n == "b" else n), t

    def scale(ws):
        for n, t in ws:
            yield n, (t.mul_(2) if n == "c" else t)

    def drop_and_add(ws):
        for n, t in ws:
            if n == "d":
                continue
            yield n, t
            if n == "a":  # a new tensor shaped like it (whisper's fake k bias): `a` itself untouched
                yield "a_bias", torch.zeros_like(t)

    def pair(ws):  # holds `e` back until `f` comes, then yields a new tensor for both (scale pairing)
        held = None
        for n, t in ws:
            if n == "e":
                held = t
            elif n == "f":
                yield "ef", torch.cat([held, t])
            else:
                yield n, t

    model = torch.nn.Module()
    assert _direct.touched_by_transforms(model, tensors) == set()
    model.hf_to_vllm_mapper = type("M", (), {"weights_transforms": [rename, scale]})()
    model.quant_config = _Quant([drop_and_add, pair])
    assert _direct.touched_by_transforms(model, tensors) == {"b", "b2", "c", "d", "e", "f", "ef", "a_bias"}
    # A transform that cannot run on metadata, or a mapper that cannot be asked: nothing planned.
    model.quant_config = _Quant([lambda ws: ((n, t.tolist()) for n, t in ws)])
    assert _direct.touched_by_transforms(model, tensors) == {n for n, _, _ in tensors}
    model.quant_config = _Quant(fail=True)
    assert _direct.touched_by_transforms(model, tensors) == {n for n, _, _ in tensors}
