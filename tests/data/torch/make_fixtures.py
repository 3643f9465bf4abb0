#!/usr/bin/python3
"""Writes the PyTorch checkpoint fixtures of weightlift's tests, with a real torch.

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/data/torch/make_fixtures.py
Every file is small and deterministic; expected.json records, for each tensor,
what torch.load sees (dtype, shape, strides, storage offset, the storage it
shares) and the sha256 of its logical C-contiguous bytes.
"""
import collections
import hashlib
import io
import json
import os
import struct
import sys
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.complex64: "C64", torch.complex128: "C128", torch.complex32: "C32",
}


def logical_bytes(t):
    t = t.detach().contiguous().flatten()
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def flatten(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten(v, f"{prefix}.{i}" if prefix else str(i))


def describe(path):
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    out = []
    ptrs = {}
    for name, t in flatten(loaded):
        key = t.storage().data_ptr() if t.storage().size() > 0 else None  # empty storages have no identity
        out.append({
            "name": name, "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "strides": list(t.stride()),
            "storage_offset": t.storage_offset(), "shares_with": ptrs.get(key) if key is not None else None,
            "contiguous": t.is_contiguous(), "sha256": hashlib.sha256(logical_bytes(t)).hexdigest(),
        })
        if key is not None:
            ptrs.setdefault(key, name)
    return out


def rand(shape, dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=torch.float64).to(dtype) if not dtype.is_complex else torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


def rewrite_zip(src, dst, edit=None, force_zip64=False):
    """Copies a torch zip entry by entry (stored), optionally editing records or forcing zip64."""
    saved = (zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT)
    if force_zip64:
        zipfile.ZIP64_LIMIT = 0
        zipfile.ZIP_FILECOUNT_LIMIT = 0
    try:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED, allowZip64=True) as zout:
            entries = [(i.filename, zin.read(i.filename)) for i in zin.infolist()]
            if edit:
                entries = edit(entries)
            for name, data in entries:
                zout.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved


def main():
    expected = {}
    good = []

    # 1. Every dtype, 0-dim and empty tensors.
    sd = {}
    for dt in [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
               torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]:
        sd[f"t_{DTYPE_NAMES[dt].lower()}"] = rand((3, 5), dt)
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.zeros((0, 4))
    sd["empty_i64"] = torch.zeros((2, 0, 3), dtype=torch.int64)
    torch.save(sd, os.path.join(HERE, "dtypes.pt"))
    good.append("dtypes.pt")

    # 2. Views: tied storage, offsets, transposes, strided slices, expand (stride 0).
    base = rand((6, 8), torch.float32)
    emb = rand((10, 4), torch.float16)
    qkv = rand((12, 4), torch.bfloat16)
    views = collections.OrderedDict()
    views["embed.weight"] = emb
    views["lm_head.weight"] = emb                  # tied: same storage, same offset
    views["base"] = base
    views["base_t"] = base.t()                     # transpose
    views["rows"] = base[2:5]                      # offset, contiguous
    views["cols"] = base[:, 1:7:2]                 # offset + strides
    views["q"], views["k"], views["v"] = qkv.split(4)  # one storage, three offsets
    views["expanded"] = torch.arange(3, dtype=torch.int32).view(3, 1).expand(3, 4)
    views["perm"] = rand((2, 3, 4), torch.float64).permute(2, 0, 1)
    torch.save(views, os.path.join(HERE, "views.bin"))
    good.append("views.bin")

    # 3. A module's state_dict (OrderedDict with _metadata) and a dict of Parameters.
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    torch.save(model.state_dict(), os.path.join(HERE, "state_dict.bin"))
    good.append("state_dict.bin")
    torch.save({"p": torch.nn.Parameter(rand((2, 2), torch.float32)),
                "frozen": torch.nn.Parameter(rand((3,), torch.float32), requires_grad=False)},
               os.path.join(HERE, "params.pt"))
    good.append("params.pt")

    # 4. Wrapped and nested objects.
    torch.save({"state_dict": {"w": rand((2, 3), torch.float32), "b": rand((3,), torch.float32)}, "epoch": 3,
                "note": "hello"}, os.path.join(HERE, "wrapped.bin"))
    good.append("wrapped.bin")
    torch.save({"model": {"a": rand((2,), torch.int32)}, "list": [rand((1,), torch.float32), rand((2,), torch.float32)]},
               os.path.join(HERE, "nested.pt"))
    good.append("nested.pt")

    # 5. The legacy (pre-zip) format, with shared storages and views.
    torch.save(views, os.path.join(HERE, "legacy.bin"), _use_new_zipfile_serialization=False)
    good.append("legacy.bin")

    # 6. Zip64 records (forced on a small file) read by torch itself.
    rewrite_zip(os.path.join(HERE, "views.bin"), os.path.join(HERE, "zip64.pt"), force_zip64=True)
    good.append("zip64.pt")

    # 7. Big-endian: the byteorder record says "big" and the storages are byte-swapped.
    be_src = {"f32": rand((2, 3), torch.float32), "i64": rand((4,), torch.int64), "c64": rand((2,), torch.complex64),
              "u8": rand((3,), torch.uint8)}
    tmp = io.BytesIO()
    torch.save(be_src, tmp)
    tmp.seek(0)
    sizes = {}
    with zipfile.ZipFile(tmp) as z:
        pkl = z.read("archive/data.pkl")
    # storage key -> element width, from the pickle's storage classes
    import pickletools
    widths = {"FloatStorage": 4, "LongStorage": 8, "ComplexFloatStorage": 4, "ByteStorage": 1}
    last_global = None
    for op, arg, _ in pickletools.genops(pkl):
        if op.name == "GLOBAL" and arg.startswith("torch ") and arg.endswith("Storage"):
            last_global = arg.split(" ")[1]
        elif op.name == "BINUNICODE" and last_global and arg.isdigit():
            sizes[arg] = widths[last_global]
            last_global = None

    def to_big(entries):
        out = []
        for name, data in entries:
            key = name.rsplit("/", 1)[-1]
            if "/data/" in name and sizes.get(key, 1) > 1:
                w = sizes[key]
                data = b"".join(data[i:i + w][::-1] for i in range(0, len(data), w))
            out.append((name, data))
        out.append(("archive/byteorder", b"big"))
        return out
    tmp.seek(0)
    with open(os.path.join(HERE, "bigendian.pt.src"), "wb") as f:
        f.write(tmp.getvalue())
    rewrite_zip(os.path.join(HERE, "bigendian.pt.src"), os.path.join(HERE, "bigendian.pt"), edit=to_big)
    os.remove(os.path.join(HERE, "bigendian.pt.src"))
    # torch 1.13 does not read byteorder: the expected values are those of the little-endian source.
    expected["bigendian.pt"] = [
        {"name": k, "dtype": DTYPE_NAMES[v.dtype], "shape": list(v.shape), "strides": list(v.stride()),
         "storage_offset": 0, "shares_with": None, "contiguous": True,
         "sha256": hashlib.sha256(logical_bytes(v)).hexdigest()} for k, v in be_src.items()]

    for name in good:
        expected[name] = describe(os.path.join(HERE, name))

    # ---- hostile files: each must be refused with a clear error --------------------
    def evil_zip(path, pkl):
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            z.writestr(zipfile.ZipInfo("archive/data.pkl", date_time=(2020, 1, 1, 0, 0, 0)), pkl)
            z.writestr(zipfile.ZipInfo("archive/version", date_time=(2020, 1, 1, 0, 0, 0)), b"3\n")

    # os.system("echo pwned") as a pickle, and builtins.eval
    evil_zip(os.path.join(HERE, "evil_system.pt"), b"\x80\x02cposix\nsystem\nq\x00X\x0b\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.")
    evil_zip(os.path.join(HERE, "evil_eval.pt"), b"\x80\x02cbuiltins\neval\nq\x00X\x0b\x00\x00\x00print(1234)\x85Rq\x01.")
    # a storage record shorter than the pickle says
    def shorten(entries):
        return [(n, d[: len(d) // 2] if n.endswith("/data/0") else d) for n, d in entries]
    rewrite_zip(os.path.join(HERE, "dtypes.pt"), os.path.join(HERE, "short_storage.pt"), edit=shorten)
    # a pickle declaring a huge storage and a huge tensor
    huge = (b"\x80\x02}q\x00X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\n"
            b"FloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10tQK\x00"
            b"\x8a\x05\x00\x00\x00\x00\x01K\x01\x86K\x01K\x01\x86\x89ccollections\nOrderedDict\n)RtRs.")
    with zipfile.ZipFile(os.path.join(HERE, "huge_storage.pt"), "w", zipfile.ZIP_STORED) as z:
        z.writestr(zipfile.ZipInfo("archive/data.pkl", date_time=(2020, 1, 1, 0, 0, 0)), huge)
        z.writestr(zipfile.ZipInfo("archive/data/0", date_time=(2020, 1, 1, 0, 0, 0)), b"\0" * 16)
    # a truncated archive and random bytes
    with open(os.path.join(HERE, "views.bin"), "rb") as f:
        data = f.read()
    with open(os.path.join(HERE, "truncated.bin"), "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    rnd = torch.Generator().manual_seed(7)
    with open(os.path.join(HERE, "random.bin"), "wb") as f:
        f.write(bytes(torch.randint(0, 256, (4096,), generator=rnd, dtype=torch.uint8).tolist()))

    for bad in ["evil_system.pt", "evil_eval.pt"]:
        try:
            torch.load(os.path.join(HERE, bad), weights_only=True)
            sys.exit(f"torch accepted {bad}")
        except Exception as e:  # noqa: BLE001 - torch refuses it too
            print(f"torch refuses {bad}: {str(e).splitlines()[0][:90]}")

    make_npy(expected)

    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", len(expected), "fixtures in", HERE)


def npy_with_header(good, shape):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape
    hdr = hdr.ljust(117) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + good[128:]


def make_npy(expected):
    """NumPy .npy files of every format version, both orders and byte orders, plus broken ones."""
    import numpy as np
    from numpy.lib import format as npf
    d = os.path.join(HERE, "npy")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(3)
    arrays = {
        "v1_f32.npy": ((1, 0), rng.standard_normal((3, 4)).astype("<f4")),
        "v2_i64.npy": ((2, 0), np.arange(10, dtype="<i8").reshape(2, 5)),
        "v3_f16.npy": ((3, 0), rng.standard_normal((2, 3)).astype("<f2")),
        "fortran_f64.npy": ((1, 0), np.asfortranarray(rng.standard_normal((3, 5, 2)))),
        "big_f64.npy": ((1, 0), rng.standard_normal((4, 3)).astype(">f8")),
        "big_c64.npy": ((1, 0), (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(">c8")),
        "bool.npy": ((1, 0), rng.standard_normal(7) > 0),
        "u8.npy": ((1, 0), np.arange(5, dtype=np.uint8)),
        "scalar.npy": ((1, 0), np.array(2.5, dtype="<f8")),
        "empty.npy": ((1, 0), np.zeros((0, 3), dtype="<i4")),
    }
    names = {"<f4": "F32", "<i8": "I64", "<f2": "F16", "<f8": "F64", ">f8": "F64", ">c8": "C64", "|b1": "BOOL",
             "|u1": "U8", "<i4": "I32"}
    for name, (version, a) in arrays.items():
        with open(os.path.join(d, name), "wb") as f:
            npf.write_array(f, a, version=version)
        c = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"))
        expected["npy/" + name] = {"dtype": names[a.dtype.str], "shape": list(a.shape),
                                   "sha256": hashlib.sha256(c.tobytes()).hexdigest()}
    with open(os.path.join(d, "v1_f32.npy"), "rb") as f:
        good = f.read()
    bad = {
        "bad_truncated.npy": good[:-5],
        "bad_magic.npy": b"\x93NUMPX" + good[6:],
        "bad_overflow_shape.npy": npy_with_header(good, "(1099511627776, 1099511627776)"),
        "bad_huge_shape.npy": npy_with_header(good, "(1000000, 1000000)"),
        "bad_header_len.npy": good[:8] + b"\xff\xff" + good[10:],
    }
    structured = io.BytesIO()
    np.save(structured, np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    bad["bad_structured.npy"] = structured.getvalue()
    for name, data in bad.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
