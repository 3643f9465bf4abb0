"""Every weightlift iterator gives exactly the tensors that the `safetensors`
package and `torch.load` give on the same files: same names, dtypes, shapes
and bytes."""
import os
import shutil
import subprocess

import pytest
import torch
from safetensors import safe_open as st_safe_open
from safetensors.torch import load_file as st_load_file
from safetensors.torch import save_file as st_save_file

import weightlift
from weightlift import vllm_compat


def _cli():
    cli = os.environ.get("WEIGHTLIFT_CLI")
    if cli and os.path.exists(cli):
        return cli
    here = os.path.dirname(os.path.abspath(__file__))
    cand = os.path.join(here, "..", "..", "build", "bin", "weightlift")
    return cand if os.path.exists(cand) else shutil.which("weightlift")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # Bytes, not values: NaN payloads and -0.0 must survive too.
    return a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8)) \
        if a.numel() else True


def _reference_safetensors(files):
    out = {}
    for f in files:
        with st_safe_open(f, framework="pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


@pytest.fixture(scope="module")
def synth_model(tmp_path_factory):
    """A Llama-shaped model folder written by `weightlift synth` (bf16 + f32, 3 shards)."""
    cli = _cli()
    if not cli:
        pytest.skip("the weightlift CLI is not built (build/bin/weightlift)")
    d = tmp_path_factory.mktemp("synth")
    subprocess.run([cli, "synth", str(d), "--size", "6MB", "--seed", "7"], check=True,
                   stdout=subprocess.DEVNULL)
    files = sorted(str(p) for p in d.glob("*.safetensors"))
    assert len(files) >= 2
    return d, files


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    """One file with every dtype torch 1.13 and safetensors share, odd shapes included."""
    g = torch.Generator().manual_seed(0)
    t = {
        "f32": torch.randn(7, 5, generator=g),
        "f16": torch.randn(3, 9, generator=g).half(),
        "bf16": torch.randn(4, 4, 2, generator=g).bfloat16(),
        "f64": torch.randn(6, generator=g).double(),
        "i8": torch.randint(-128, 127, (11,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (2, 3), generator=g, dtype=torch.uint8),
        "i16": torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int16),
        "i32": torch.randint(-10**6, 10**6, (3, 1), generator=g, dtype=torch.int32),
        "i64": torch.arange(13, dtype=torch.int64) * 10**12,
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
    }
    d = tmp_path_factory.mktemp("mixed")
    p = str(d / "model.safetensors")
    st_save_file(t, p, metadata={"format": "pt"})
    return p, t


@pytest.mark.parametrize("strategy", [None, "lazy", "eager", "prefetch"])
def test_safetensors_iterator_matches_safetensors(synth_model, strategy):
    _, files = synth_model
    ref = _reference_safetensors(files)
    got = list(vllm_compat.safetensors_weights_iterator(files, False, strategy))
    assert len(got) == len(ref)
    assert {n for n, _ in got} == set(ref)
    for name, t in got:
        assert _same(t, ref[name]), name


def test_safetensors_iterator_order_matches_reference(synth_model):
    """Files in natural order, names sorted within a file (safe_open().keys())."""
    _, files = synth_model
    expected = []
    for f in sorted(files, key=vllm_compat._natural_sort_key):
        with st_safe_open(f, framework="pt") as h:
            expected += list(h.keys())
    got = [n for n, _ in vllm_compat.safetensors_weights_iterator(list(reversed(files)), False)]
    assert got == expected


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_every_dtype_matches(mixed_file, strategy):
    p, t = mixed_file
    got = dict(weightlift.safetensors_weights_iterator([p], False, strategy))
    ref = st_load_file(p)
    assert set(got) == set(ref) == set(t)
    for k in t:
        assert _same(got[k], ref[k]), k
        assert _same(got[k], t[k]), k


def test_eager_order_is_keys_order(synth_model):
    """The reference's eager path yields safetensors.torch.load()'s dict, whose
    order is a hash order that changes from process to process; ours is the
    same tensors file by file in keys() order, as lazy."""
    from safetensors.torch import load as st_load

    _, files = synth_model
    expected, loaded = [], set()
    for f in sorted(files, key=vllm_compat._natural_sort_key):
        with st_safe_open(f, framework="pt") as h:
            expected += list(h.keys())
        with open(f, "rb") as h:
            loaded |= set(st_load(h.read()))
    got = [n for n, _ in vllm_compat.safetensors_weights_iterator(files, False, "eager")]
    assert got == expected and set(got) == loaded


def test_multi_thread_iterator_matches(synth_model):
    _, files = synth_model
    ref = _reference_safetensors(files)
    got = list(vllm_compat.multi_thread_safetensors_weights_iterator(files, False, max_workers=2))
    assert len(got) == len(ref)
    for name, t in got:
        assert _same(t, ref[name]), name


@pytest.mark.parametrize("strategy", ["lazy", "eager"])
def test_stream_weights_matches(synth_model, strategy):
    d, files = synth_model
    ref = _reference_safetensors(files)
    got = list(weightlift.stream_weights(str(d), strategy, max_queued_bytes=1 << 20))
    assert len(got) == len(ref)
    for name, t in got:
        assert _same(t, ref[name]), name


@pytest.mark.parametrize("strategy,opts", [
    ("prefetch", {"threads": 2, "block_size": 1 << 20}), ("auto", {}), ("threads", {"threads": 2}),
    ("stream", {"threads": 2, "block_size": 1 << 20, "max_memory": 4 << 20, "direct": "off"}),
])
def test_stream_weights_engine_strategies_match(synth_model, strategy, opts):
    """The engine's parallel strategies (where this build has them) give the same tensors."""
    d, files = synth_model
    ref = _reference_safetensors(files)
    try:
        got = list(weightlift.stream_weights(str(d), strategy, **opts))
    except ValueError as e:
        if "unknown strategy" in str(e) or "has no option" in str(e):
            pytest.skip(f"this build's engine has no {strategy}: {e}")
        raise
    assert sorted(n for n, _ in got) == sorted(ref)
    for name, t in got:
        assert _same(t, ref[name]), name


def test_stream_weights_expert_filter(tmp_path):
    t = {"model.embed.weight": torch.randn(4, 4)}
    for e in range(4):
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] = torch.randn(2, 4)
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight_scale"] = torch.randn(1)
    p = str(tmp_path / "model.safetensors")
    st_save_file(t, p)
    got = dict(weightlift.stream_weights([p], local_expert_ids={1, 2}))
    assert set(got) == set(t) - {"model.layers.0.mlp.experts.0.up_proj.weight",
                                 "model.layers.0.mlp.experts.3.up_proj.weight"}
    for n, v in got.items():
        assert _same(v, t[n])


def test_stream_weights_closed_early(synth_model):
    """Abandoning the stream stops the background loader without error."""
    _, files = synth_model
    it = weightlift.stream_weights(files, max_queued_bytes=1)
    name, t = next(it)
    it.close()
    assert t.numel() > 0


def test_safe_open_matches(mixed_file):
    p, t = mixed_file
    with weightlift.safe_open(p, framework="pt") as f, st_safe_open(p, framework="pt") as r:
        assert f.keys() == list(r.keys())
        assert f.metadata() == r.metadata()
        for k in f.keys():
            assert _same(f.get_tensor(k), r.get_tensor(k)), k
        for k in ("f32", "bf16", "i64"):
            a, b = f.get_slice(k), r.get_slice(k)
            assert a.get_shape() == b.get_shape() and a.get_dtype() == b.get_dtype()
            assert _same(a[1:3], b[1:3]) and _same(a[:1], b[:1]) and _same(a[2:], b[2:])


def test_safe_open_numpy_is_writable_like_safetensors(mixed_file):
    """safetensors 0.8 hands out writable numpy arrays (get_tensor, get_tensors,
    slices); so do we, and a write never reaches the file."""
    p, t = mixed_file
    with weightlift.safe_open(p, framework="np") as f, st_safe_open(p, framework="np") as r:
        a, b = f.get_tensor("f32"), r.get_tensor("f32")
        assert (a == t["f32"].numpy()).all()
        assert a.flags.writeable == b.flags.writeable
        assert f.get_slice("f32")[1:3].flags.writeable == r.get_slice("f32")[1:3].flags.writeable
        a[0, 0] = 1.0
        with pytest.raises(TypeError, match="BF16"):
            f.get_tensor("bf16")
    assert _same(st_load_file(p)["f32"], t["f32"])


def test_get_tensors_matches_safetensors(mixed_file):
    p, _ = mixed_file
    with weightlift.safe_open(p, framework="pt") as f, st_safe_open(p, framework="pt") as r:
        ours, theirs = f.get_tensors(), r.get_tensors()
        assert list(ours) == list(theirs)  # offset order
        for k in theirs:
            assert _same(ours[k], theirs[k]), k


def test_get_slice_any_dim_matches_safetensors(mixed_file):
    p, _ = mixed_file
    with weightlift.safe_open(p) as f, st_safe_open(p, framework="pt") as r:
        for k, index in (("f32", (slice(None), slice(1, 4))), ("bf16", (slice(None), slice(1, 3), slice(None))),
                         ("bf16", (slice(None), slice(None), slice(0, 1))), ("f32", (slice(2, 5), 1)),
                         ("i64", slice(3, None)), ("f32", (slice(None), slice(4, 2)))):
            assert _same(f.get_slice(k)[index], r.get_slice(k)[index]), (k, index)


def test_safe_open_pread_backend(mixed_file):
    p, t = mixed_file
    with weightlift.safe_open(p, framework="pt", backend="pread") as f:
        assert _same(f.get_tensor("i64"), t["i64"])
    with pytest.raises(ValueError, match='backend "gds" is invalid'):
        weightlift.safe_open(p, backend="gds")


def test_tensors_are_private_and_writable(mixed_file):
    """A write to a yielded tensor never reaches the file or the next reader."""
    p, t = mixed_file
    for strategy in ("lazy", "eager"):
        got = dict(weightlift.safetensors_weights_iterator([p], False, strategy))
        got["f32"].fill_(7.0)
    assert _same(st_load_file(p)["f32"], t["f32"])
    assert _same(weightlift.load_file(p)["f32"], t["f32"])


def test_tensor_outlives_file_handle(mixed_file):
    p, t = mixed_file
    with weightlift.safe_open(p) as f:
        x = f.get_tensor("i64")
    del f
    import gc

    gc.collect()
    assert _same(x, t["i64"])


def test_save_file_matches_safetensors_bytes(tmp_path, mixed_file):
    _, t = mixed_file
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    weightlift.save_file(t, ours, metadata={"format": "pt"})
    st_save_file(t, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.fixture(scope="module")
def pt_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt")
    g = torch.Generator().manual_seed(1)
    files = []
    for i in range(3):
        state = {f"layer.{i}.weight": torch.randn(8, 4, generator=g).bfloat16(),
                 f"layer.{i}.bias": torch.randn(8, generator=g),
                 f"layer.{i}.idx": torch.arange(5)}
        p = str(d / f"pytorch_model-0000{i + 1}-of-00003.bin")
        torch.save(state, p)
        files.append(p)
    return files


def _torch_load_all(files):
    out = []
    for f in files:
        out += list(torch.load(f, map_location="cpu", weights_only=True).items())
    return out


def test_pt_iterator_matches_torch_load(pt_files):
    ref = _torch_load_all(pt_files)
    got = list(vllm_compat.pt_weights_iterator(pt_files, False))
    assert [n for n, _ in got] == [n for n, _ in ref]
    for (_, a), (_, b) in zip(got, ref):
        assert _same(a, b)


def test_multi_thread_pt_iterator_matches_torch_load(pt_files):
    ref = dict(_torch_load_all(pt_files))
    got = list(vllm_compat.multi_thread_pt_weights_iterator(pt_files, False, max_workers=2))
    assert len(got) == len(ref)
    for n, t in got:
        assert _same(t, ref[n]), n


def test_np_cache_iterator_matches_torch_load(tmp_path):
    files = []
    for i in range(2):
        p = str(tmp_path / f"pytorch_model-{i}.bin")
        torch.save({f"w{i}": torch.randn(3, 3), f"b{i}": torch.arange(4, dtype=torch.int32)}, p)
        files.append(p)
    ref = dict(_torch_load_all(files))
    for _ in range(2):  # the first pass writes the cache, the second reads it
        got = list(vllm_compat.np_cache_weights_iterator("m/np", str(tmp_path), str(tmp_path), files, False))
        assert [n for n, _ in got] == list(ref)
        for n, t in got:
            assert _same(t, ref[n]), n
    assert os.path.exists(tmp_path / "np" / "weight_names.json")


def test_convert_bin_to_safetensor_file(tmp_path):
    w = torch.randn(4, 4)
    state = {"a": w, "tied": w, "b": torch.randn(2, 3).t()}  # an alias and a non-contiguous view
    pt = str(tmp_path / "pytorch_model.bin")
    torch.save({"state_dict": state}, pt)
    sf = str(tmp_path / "out" / "model.safetensors")
    vllm_compat.convert_bin_to_safetensor_file(pt, sf)
    ref = st_load_file(sf)
    assert set(ref) == {"a", "b"}
    assert _same(ref["a"], w) and _same(ref["b"], state["b"].contiguous())
    with st_safe_open(sf, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
