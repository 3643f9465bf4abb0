"""weightlift.safetensors against the safetensors package (0.8) beyond what
safetensors' own suite checks (tests/python/safetensors_suite runs that):
the same exception classes for every bad input, the same bytes for every
writer, the same tensors and order for every reader, handle lifetime and
threads, and where we deliberately depart from it."""
import pickle
import threading

import numpy as np
import pytest
import safetensors as real
import safetensors.numpy as real_np
import safetensors.torch as real_pt
import torch

import weightlift
import weightlift.safetensors as wl
import weightlift.safetensors.numpy as wl_np
import weightlift.safetensors.torch as wl_pt
from weightlift import CorruptDataError

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64]


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, dt in enumerate(DTYPES):
        shape = [(3, 5), (4,), (2, 0), (), (1, 2, 3)][i % 5]
        if dt.is_floating_point or dt.is_complex:
            out[f"t{i}"] = torch.randn(shape, generator=g).to(dt)
        elif dt == torch.bool:
            out[f"t{i}"] = torch.randint(0, 2, shape, generator=g).bool()
        else:
            out[f"t{i}"] = torch.randint(-100, 100, shape, generator=g).to(dt)
    return out


def _same(a, b):
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().view(-1).view(torch.uint8).tolist() == b.contiguous().view(-1).view(torch.uint8).tolist()


@pytest.fixture()
def st_file(tmp_path):
    p = str(tmp_path / "m.safetensors")
    t = _tensors()
    real_pt.save_file(t, p, metadata={"format": "pt"})
    return p, t


# ---- the package's shape ----------------------------------------------------------------------

def test_names_and_classes_mirror_the_package():
    for name in ("SafetensorError", "TensorSpec", "safe_open", "_safe_open_handle", "serialize", "serialize_file",
                 "deserialize", "__version__"):
        assert hasattr(wl, name), name
    for name in ("save", "save_file", "load", "load_file", "save_model", "load_model", "storage_ptr", "storage_size",
                 "_find_shared_tensors", "_remove_duplicate_names", "_is_complete", "_end_ptr"):
        assert hasattr(wl_pt, name), name
    for name in ("save", "save_file", "load", "load_file"):
        assert hasattr(wl_np, name), name
    # The release whose API it mirrors (0.9.0rc1); the control package here is 0.8.0, whose API 0.9 keeps.
    assert wl.__version__ == "0.9.0-rc.1" and real.__version__ == "0.8.0"  # as 0.9.0rc1 spells itself
    for name in ("PrefetchLoader", "TensorMeta", "PySafeSlice", "PrefetchPlan"):  # 0.9's additions
        assert hasattr(wl, name), name
    assert wl.SafeSlice is wl.PySafeSlice
    # SafetensorError is an Exception and nothing more, as safetensors'; its module imports.
    assert wl.SafetensorError.__mro__[1:] == real.SafetensorError.__mro__[1:] == (Exception, BaseException, object)
    assert wl.SafetensorError.__module__ == "weightlift.safetensors"
    # weightlift's own names are the same objects.
    assert weightlift.safe_open is wl.safe_open
    assert weightlift.load_file is wl_pt.load_file and weightlift.save_file is wl_pt.save_file


def test_errors_pickle():
    for e in (wl.SafetensorError("x"), wl.SafetensorValueError("y"), wl.SafetensorKeyError("File does not contain"),
              wl.SafetensorCorruptError("z"), wl.SafetensorOSError("w")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e)


# ---- the same exception for every bad input ------------------------------------------------------

def _raises(fn):
    try:
        fn()
    except BaseException as e:  # noqa: B902 - comparing whatever is raised
        return e
    return None


def _bad_inputs(tmp_path, st_file):
    p, _ = st_file
    out = str(tmp_path / "o.safetensors")
    arr = np.arange(4, dtype=np.float32)
    A = torch.arange(6.0).reshape(2, 3)
    return {
        "not a dict": lambda m: m["pt"].save_file("notadict", out),
        "value not a tensor": lambda m: m["pt"].save_file({"a": {}}, out),
        "sparse": lambda m: m["pt"].save_file({"a": torch.sparse_coo_tensor(size=(2, 3))}, out),
        "shared": lambda m: m["pt"].save_file({"a": A, "b": A[:1]}, out),
        "shared, save": lambda m: m["pt"].save({"a": A, "b": A[1:]}),
        "non-contiguous": lambda m: m["pt"].save_file({"a": A.t()}, out),
        "meta tensor": lambda m: m["pt"].save_file({"a": torch.zeros(2, device="meta")}, out),
        "int key": lambda m: m["pt"].save_file({1: torch.zeros(2)}, out),
        "int metadata value": lambda m: m["pt"].save_file({"a": torch.zeros(2)}, out, metadata={"k": 1}),
        "metadata not a dict": lambda m: m["pt"].save({"a": torch.zeros(2)}, metadata=[("k", "v")]),
        "spec bad dtype": lambda m: m["st"].TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=4),
        "spec positional": lambda m: m["st"].TensorSpec("float32", [1], 0, 4),
        "spec negative dim": lambda m: m["st"].TensorSpec(dtype="float32", shape=[-1], data_ptr=0, data_len=4),
        "serialize raw dict": lambda m: m["st"].serialize({"a": {"dtype": "float32", "shape": [1]}}),
        "serialize not a dict": lambda m: m["st"].serialize([1]),
        "serialize wrong length": lambda m: m["st"].serialize(
            {"a": m["st"].TensorSpec(dtype="float32", shape=[3], data_ptr=arr.ctypes.data, data_len=16)}),
        "serialize_file into a missing folder": lambda m: m["st"].serialize_file(
            {"a": m["st"].TensorSpec(dtype="float32", shape=[4], data_ptr=arr.ctypes.data, data_len=16)},
            str(tmp_path / "no" / "such" / "dir.safetensors")),
        "numpy object array": lambda m: m["np"].save({"a": np.array(["x"])}),
        "numpy complex128": lambda m: m["np"].save({"a": np.zeros(2, np.complex128)}),
        "deserialize garbage": lambda m: m["st"].deserialize(b"123"),
        "load garbage": lambda m: m["pt"].load(b"\x05\x00\x00\x00\x00\x00\x00\x00{abc}"),
        "np load garbage": lambda m: m["np"].load(b"\xff" * 16),
        "open missing file": lambda m: m["st"].safe_open(str(tmp_path / "nope"), framework="pt"),
        "open bad header": lambda m: m["st"].safe_open(_bad_header(tmp_path), framework="pt"),
        "open bad framework": lambda m: m["st"].safe_open(p, framework="foo"),
        "open bad device": lambda m: m["st"].safe_open(p, framework="pt", device="foo"),
        "open mps:1": lambda m: m["st"].safe_open(p, framework="pt", device="mps:1"),
        "open bad backend": lambda m: m["st"].safe_open(p, framework="pt", backend="gds"),
        "backend positional": lambda m: m["st"].safe_open(p, "pt", "cpu", "pread"),
        "numpy on cuda": lambda m: m["st"].safe_open(p, framework="np", device="cuda"),
        "missing tensor": lambda m: m["st"].safe_open(p, framework="pt").get_tensor("zz"),
        "missing slice": lambda m: m["st"].safe_open(p, framework="np").get_slice("zz"),
        "load_model strict": lambda m: m["pt"].load_model(torch.nn.Linear(2, 2), p),
    }


def _bad_header(tmp_path):
    q = tmp_path / "bad.safetensors"
    q.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{abc}")
    return str(q)


def test_every_bad_input_raises_what_safetensors_raises(tmp_path, st_file):
    theirs_mods = {"st": real, "pt": real_pt, "np": real_np}
    ours_mods = {"st": wl, "pt": wl_pt, "np": wl_np}
    for label, call in _bad_inputs(tmp_path, st_file).items():
        theirs = _raises(lambda call=call: call(theirs_mods))
        ours = _raises(lambda call=call: call(ours_mods))
        assert theirs is not None, label
        assert ours is not None, f"{label}: weightlift raised nothing, safetensors raised {theirs!r}"
        # The same class, or ours a subclass: code catching safetensors' exception catches ours.
        same = type(theirs).__name__ == type(ours).__name__ == "SafetensorError" or \
            (type(theirs).__name__ == "SafetensorError" and isinstance(ours, wl.SafetensorError)) or \
            isinstance(ours, type(theirs))
        assert same, f"{label}: safetensors raised {type(theirs).__name__}, weightlift {type(ours).__mro__}"
    assert not list(tmp_path.glob("*.tmp*")) and not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("index,message", [
    ((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 5"),
    ([0, 1], "Non empty lists are not implemented"),
    ((slice(2, None), 20),
     "Error during slicing [2:, 20] with shape [10, 5]: index 20 out of bounds for tensor dimension #1 of size 5"),
    (slice(None, 20),
     "Error during slicing [:20] with shape [10, 5]: index 19 out of bounds for tensor dimension #0 of size 10"),
    ((slice(None), slice(None, 20)),
     "Error during slicing [:, :20] with shape [10, 5]: index 19 out of bounds for tensor dimension #1 of size 5"),
    ((0, 0, 0), "Error during slicing [0, 0, 0] with shape [10, 5]: more slicing indexes than dimensions in tensor"),
    ((Ellipsis, Ellipsis), "Only one ellipsis (...) is allowed in slice index"),
    (slice(None, None, -1), "Slice step must be a positive integer, got -1"),
    (1.5, "Unsupported slice index at position 0: expected slice, int, or ellipsis"),
    (None, "Unsupported slice index at position 0: expected slice, int, or ellipsis"),
])
@pytest.mark.parametrize("framework,backend", [("np", "mmap"), ("np", "pread"), ("pt", "pread")])
def test_slice_errors_word_for_word(tmp_path, index, message, framework, backend):
    p = str(tmp_path / "s.safetensors")
    real_np.save_file({"a": np.random.rand(10, 5)}, p)
    for mod in (real, wl):
        with mod.safe_open(p, framework=framework, backend=backend) as f:
            with pytest.raises(mod.SafetensorError) as e:
                f.get_slice("a")[index]
            assert str(e.value) == message, mod


# ---- the same bytes ------------------------------------------------------------------------------

def test_writers_write_safetensors_bytes(tmp_path):
    t = _tensors(1)
    t.update({f"many.{i}": torch.full((i % 7 + 1,), float(i)) for i in range(300)})
    for meta in (None, {"format": "pt"}):
        want = real_pt.save(t, metadata=meta)
        assert wl_pt.save(t, metadata=meta) == want
        wl_pt.save_file(t, tmp_path / "a.safetensors", metadata=meta)
        assert (tmp_path / "a.safetensors").read_bytes() == want
    n = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array(True), "e": np.zeros((0, 2), np.int16),
         "big": np.arange(5, dtype=">i4"), "u64": np.arange(3, dtype=np.uint64)}
    assert wl_np.save(n) == real_np.save(n)
    wl_np.save_file(n, tmp_path / "n.safetensors", metadata={"k": "v"})
    assert (tmp_path / "n.safetensors").read_bytes() == real_np.save(n, metadata={"k": "v"})
    assert wl_pt.save({}) == real_pt.save({})
    specs = {"x": wl.TensorSpec(dtype="float32", shape=(3,), data_ptr=n["f"].ctypes.data, data_len=12)}
    rspecs = {"x": real.TensorSpec(dtype="float32", shape=(3,), data_ptr=n["f"].ctypes.data, data_len=12)}
    assert wl.serialize(specs) == real.serialize(rspecs)
    wl.serialize_file(specs, tmp_path / "s.safetensors", metadata={"a": "b"})
    assert (tmp_path / "s.safetensors").read_bytes() == real.serialize(rspecs, metadata={"a": "b"})


def test_tensorspec_mirrors_safetensors():
    a = wl.TensorSpec(dtype="bfloat16", shape=[2, 3], data_ptr=1234, data_len=12)
    b = real.TensorSpec(dtype="bfloat16", shape=[2, 3], data_ptr=1234, data_len=12)
    assert (a.dtype, a.shape, a.data_ptr, a.data_len) == (b.dtype, b.shape, b.data_ptr, b.data_len)
    assert repr(a) == repr(b)
    f4 = wl.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 3], data_ptr=0, data_len=6)
    assert f4.shape == real.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 3], data_ptr=0, data_len=6).shape == [2, 6]
    with pytest.raises(AttributeError):
        a.dtype = "F32"


def test_numpy_writer_writes_values_of_non_contiguous_arrays(tmp_path):
    """safetensors 0.8 writes a non-contiguous array's raw memory (wrong values); we write its values."""
    a = np.arange(16, dtype=np.float32).reshape(4, 4)[:, 1]
    got = wl_np.load(wl_np.save({"a": a}))["a"]
    assert got.tolist() == [1.0, 5.0, 9.0, 13.0]
    assert wl_np.save({"a": a}) == real_np.save({"a": np.ascontiguousarray(a)})


def test_fnuz_float8_kinds_round_trip(tmp_path):
    raw = np.arange(6, dtype=np.uint8)
    for dtype, code in (("float8_e4m3fnuz", "F8_E4M3FNUZ"), ("float8_e5m2fnuz", "F8_E5M2FNUZ")):
        spec = {"x": wl.TensorSpec(dtype=dtype, shape=[2, 3], data_ptr=raw.ctypes.data, data_len=6)}
        rspec = {"x": real.TensorSpec(dtype=dtype, shape=[2, 3], data_ptr=raw.ctypes.data, data_len=6)}
        data = wl.serialize(spec)
        assert data == real.serialize(rspec)
        (tmp_path / "f.safetensors").write_bytes(data)
        with wl.safe_open(tmp_path / "f.safetensors", framework="pt") as f:
            assert f.get_slice("x").get_dtype() == code


# ---- the same tensors ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_readers_give_safetensors_tensors_in_its_order(st_file, backend):
    p, t = st_file
    ours, theirs = wl_pt.load_file(p, backend=backend), real_pt.load_file(p, backend=backend)
    assert list(ours) == list(theirs)  # offset order
    for k in t:
        assert _same(ours[k], theirs[k]) and _same(ours[k], t[k]), k
    with wl.safe_open(p, framework="pt", backend=backend) as f, real.safe_open(p, framework="pt", backend=backend) as r:
        assert f.keys() == r.keys() and f.offset_keys() == r.offset_keys() and f.metadata() == r.metadata()
        for k in f.keys():
            assert _same(f.get_tensor(k), r.get_tensor(k))
            s, rs = f.get_slice(k), r.get_slice(k)
            assert s.get_shape() == rs.get_shape() and s.get_dtype() == rs.get_dtype()
            if s.get_shape() and s.get_shape()[0] > 1 and 0 not in s.get_shape():
                assert _same(s[1:], rs[1:]) and _same(s[:1], rs[:1]) and _same(s[..., :1], rs[..., :1])
    n = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False]), "z": np.zeros((0, 3))}
    q = p + ".np"
    real_np.save_file(n, q)
    ours, theirs = wl_np.load_file(q, backend=backend), real_np.load_file(q, backend=backend)
    assert list(ours) == list(theirs)
    for k in n:
        assert _same(ours[k], theirs[k]), k
        assert ours[k].flags.writeable
    data = open(p, "rb").read()

    def values(d):
        return {k: v.float().tolist() if v.dtype == torch.bfloat16 else v.tolist() for k, v in d.items()}

    assert values(wl_pt.load(data)) == values(real_pt.load(data))
    assert sorted(wl.deserialize(data)) == sorted(real.deserialize(data))


def test_loaded_tensors_keep_separate_storages_like_safetensors(st_file, tmp_path):
    """Each tensor has its own storage (torch.save of one writes only its bytes;
    save_file(load_file(p)) sees no shared memory)."""
    p, t = st_file
    got = wl_pt.load_file(p)
    assert all(len(g) == 1 for g in wl_pt._find_shared_tensors(got))
    wl_pt.save_file(got, tmp_path / "again.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "again.safetensors").read_bytes() == open(p, "rb").read()
    assert wl_pt.load(wl_pt.save(got)).keys() == got.keys()


def test_writes_never_reach_the_file_and_overwrite_keeps_loaded_tensors(st_file):
    p, t = st_file
    before = open(p, "rb").read()
    got = wl_pt.load_file(p)
    got["t0"].fill_(7.0)
    with wl.safe_open(p, framework="np") as f:
        arr = f.get_tensor("t3")
    arr[...] = 1
    assert open(p, "rb").read() == before
    # Saving over the file a live mapping reads (a temporary renamed into place) leaves the old tensors intact.
    wl_pt.save_file({"other": torch.zeros(3)}, p)
    assert got["t0"].eq(7.0).all() and _same(got["t1"], t["t1"])
    assert list(wl_pt.load_file(p)) == ["other"]


# ---- handles ------------------------------------------------------------------------------------------

def test_closed_handle_says_file_is_closed(st_file):
    p, t = st_file
    with wl.safe_open(p, framework="pt") as f:
        s = f.get_slice("t0")
        x = f.get_tensor("t1")
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("t0"),
                 lambda: f.get_slice("t0")):
        with pytest.raises(wl.SafetensorError, match="^File is closed$"):
            call()
    assert _same(s[:2], t["t0"][:2]) and _same(x, t["t1"])  # slices and tensors outlive the handle
    f.__exit__(None, None, None)  # closing twice is fine


def test_one_handle_many_threads(st_file):
    p, t = st_file
    errors, rounds = [], 50
    for backend in ("mmap", "pread"):
        with wl.safe_open(p, framework="pt", backend=backend) as f:
            def work():
                try:
                    for _ in range(rounds):
                        for k in f.keys():
                            assert _same(f.get_tensor(k), t[k])
                            if t[k].dim() and t[k].shape[0] > 1:
                                assert _same(f.get_slice(k)[1:], t[k][1:])
                except BaseException as e:  # noqa: B902
                    errors.append(e)

            threads = [threading.Thread(target=work) for _ in range(8)]
            [th.start() for th in threads]
            [th.join() for th in threads]
    assert not errors, errors[:3]


def test_safe_open_handle_takes_a_file_object(st_file):
    p, t = st_file
    with open(p, "rb") as fh, wl._safe_open_handle(fh, framework="pt") as f:
        assert _same(f.get_tensor("t2"), t["t2"])
    with pytest.raises(AttributeError):
        wl._safe_open_handle(object(), framework="pt")


def test_devices_and_errors_name_what_is_wrong(st_file):
    p, _ = st_file
    with wl.safe_open(p, framework="pt", device=torch.device("cpu")) as f:  # a torch.device is accepted too
        assert f.get_tensor("t0").device.type == "cpu"
    with pytest.raises(ValueError, match='backend "gds" is invalid'):
        wl.safe_open(p, framework="pt", backend="gds")
    with pytest.raises(wl.SafetensorError, match="framework tf is not supported by weightlift"):
        wl.safe_open(p, framework="tf")
    with pytest.raises(FileNotFoundError, match="^No such file or directory: /no/such$"):
        wl.safe_open("/no/such", framework="np")


def test_corrupt_file_is_safetensor_error_and_corrupt_data_error(tmp_path):
    p = tmp_path / "c.safetensors"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"w":{"dtype":1}}')
    with pytest.raises(wl.SafetensorError, match="^Error while deserializing header: ") as e:
        wl.safe_open(p, framework="pt")
    assert isinstance(e.value, CorruptDataError) and "c.safetensors" in str(e.value)
    with pytest.raises(wl.SafetensorError, match="^Error while deserializing: "):
        wl_pt.load(p.read_bytes())


# ---- slicing where safetensors crashes ---------------------------------------------------------------

@pytest.mark.parametrize("framework,backend", [("np", "mmap"), ("pt", "pread")])
def test_slices_safetensors_cannot_take(tmp_path, framework, backend):
    """safetensors raises OverflowError for negative slice bounds, SystemError
    for a slice ending before it starts, and an error for [:] of an empty dim;
    we follow Python's slicing there."""
    p = str(tmp_path / "s.safetensors")
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    real_np.save_file({"a": a, "z": np.zeros((0, 3), np.float32)}, p)
    with wl.safe_open(p, framework=framework, backend=backend) as f:
        s = f.get_slice("a")
        for index in ((slice(-1, None),), (slice(None, -1),), (slice(2, 1),), (slice(1, 3), slice(-2, None)),
                      (slice(4, None),)):
            got = s[index]
            got = got if framework == "np" else got.numpy()
            assert got.tolist() == a[index].tolist(), index
        z = f.get_slice("z")[:]
        assert tuple(z.shape) == (0, 3)


def test_save_model_and_load_model_match_safetensors(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = self.a

    m = Tied()
    wl_pt.save_model(m, tmp_path / "ours.safetensors")
    real_pt.save_model(m, str(tmp_path / "theirs.safetensors"))
    # The same file but for the order of the metadata keys (safetensors' is a HashMap's: random).
    with wl.safe_open(tmp_path / "ours.safetensors", "pt") as f, \
            real.safe_open(tmp_path / "theirs.safetensors", "pt") as r:
        assert f.metadata() == r.metadata() == {"b.bias": "a.bias", "b.weight": "a.weight"}
        assert f.keys() == r.keys() and all(_same(f.get_tensor(k), r.get_tensor(k)) for k in f.keys())
    assert len((tmp_path / "ours.safetensors").read_bytes()) == len((tmp_path / "theirs.safetensors").read_bytes())
    m2 = Tied()
    assert wl_pt.load_model(m2, tmp_path / "ours.safetensors") == (set(), [])
    assert torch.equal(m2.a.weight, m.a.weight)
    other = torch.nn.Linear(4, 2)
    ours = wl_pt.load_model(other, tmp_path / "ours.safetensors", strict=False)
    assert ours == real_pt.load_model(torch.nn.Linear(4, 2), str(tmp_path / "theirs.safetensors"), strict=False)
