#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Seeds are small valid inputs plus one of each malformed class the unit tests
cover; libFuzzer mutates from there. Re-run after changing this file:
    python3 fuzz/make_seeds.py
"""
import hashlib
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def st_header(tensors, metadata=None):
    """tensors: list of (name, dtype, shape). Returns (header_json, data_size)."""
    h = {}
    if metadata is not None:
        h["__metadata__"] = metadata
    off = 0
    for name, dt, shape in tensors:
        n = SIZES[dt]
        for d in shape:
            n *= d
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(h, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    return text.encode(), off


def st_file(header, data_size):
    return struct.pack("<Q", len(header)) + header + bytes((i * 31 + 7) & 0xFF for i in range(data_size))


VALID = [
    [],
    [("a", "F32", [2, 3])],
    [("w", "BF16", [4]), ("b", "F16", [2, 2]), ("s", "I64", [])],
    [("empty", "F32", [0, 5]), ("x", "U8", [3])],
    [("model.layers.0.self_attn.q_proj.weight", "F16", [4, 4]), ("model.embed_tokens.weight", "BF16", [8, 2])],
    [("f8", "F8_E4M3", [16]), ("g", "BOOL", [3, 1]), ("u", "U32", [2])],
]
META = [None, {"format": "pt"}, {}, None, {"format": "pt", "note": "\u00e9t\u00e9"}, None]

# (header text, data size): each one violates one rule.
MALFORMED = [
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 8),        # span != shape
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),        # gap
    (b'{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}}', 4),         # unknown dtype
    (b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', 4),       # negative dim
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', 4),        # reversed
    (b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}', 0),  # overflow
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
    (b'{"__metadata__":{"k":1}}', 0),
    (b'{"a":[]}', 0),
    (b'[1,2]', 0),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}', 4),         # truncated JSON
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}\x00\x00', 4), # junk after the object
    (b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1),      # not UTF-8
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),
    (b'{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', 2),
    (b'{"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),  # a repeated field
    (b'{"__metadata__":{"k":"1","k":"2"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1),  # repeated key
]


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for i, (tensors, meta) in enumerate(zip(VALID, META)):
        header, size = st_header(tensors, meta)
        write("fuzz_safetensors_header", f"valid-{i}", struct.pack("<H", size) + header)
        write("fuzz_safetensors_file", f"valid-{i}", st_file(header, size))
    for i, (header, size) in enumerate(MALFORMED):
        write("fuzz_safetensors_header", f"bad-{i}", struct.pack("<H", size) + header)
        write("fuzz_safetensors_file", f"bad-{i}", st_file(header, size))
    # length prefixes that lie
    write("fuzz_safetensors_file", "len-huge", struct.pack("<Q", 2**63) + b"{}")
    write("fuzz_safetensors_file", "len-past-end", struct.pack("<Q", 100) + b"{}")
    write("fuzz_safetensors_file", "short", b"\x02\x00\x00")

    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = [
        {"metadata": {"total_size": 16}, "weight_map": {"a": s1, "b": s2}},
        {"weight_map": {"a": s1, "b": s1}},
        {"weight_map": {"a": "model.safetensors"}},
        {"weight_map": {"a": "missing.safetensors"}},
        {"weight_map": {"a": "../etc/passwd"}},
        {"weight_map": {"a": "/abs.safetensors"}},
        {"weight_map": {"a": 3}},
        {"weight_map": []},
        {"metadata": {}},
        [1, 2, 3],
    ]
    for i, doc in enumerate(index):
        write("fuzz_weight_index", f"index-{i}", json.dumps(doc).encode())
    write("fuzz_weight_index", "names", b"model-2-of-10\nmodel-10-of-10\nmodel-007-of-10")
    write("fuzz_weight_index", "not-json", b"{\"weight_map\": {\"a\": \"x\"")
    write("fuzz_weight_index", "repeated-key",
          ('{"weight_map": {"a": "%s", "a": "%s"}}' % (s1, s2)).encode())

    # Hub answers: byte 0 even = revision endpoint, odd = tree page (Link header, NUL, body).
    sha = "0123456789abcdef0123456789abcdef01234567"
    hub = {
        "rev-0": b"\x00" + json.dumps({"sha": sha, "siblings": [{"rfilename": "config.json"},
                                                                {"rfilename": "model.safetensors"}]}).encode(),
        "rev-1": b"\x00" + json.dumps({"sha": "nothex", "siblings": []}).encode(),
        "rev-2": b"\x00" + json.dumps({"sha": sha, "siblings": [{"rfilename": "../../etc/passwd"}, {"rfilename": 5},
                                                                {}]}).encode(),
        "rev-3": b"\x00[1,2",
        "tree-0": b"\x01\x00" + json.dumps([{"type": "file", "path": "model.safetensors", "size": 10, "oid": "ab",
                                              "lfs": {"oid": "cd", "size": 10}},
                                             {"type": "directory", "path": "sub"}]).encode(),
        "tree-1": b'\x01<http://127.0.0.1:1/api/models/org/model/tree/main?cursor=x>; rel="next"\x00'
                  + json.dumps([{"type": "file", "path": "a/b.bin", "size": 1}]).encode(),
        "tree-2": b'\x01<http://evil.example/x>; rel="next"\x00[]',
        "tree-3": b"\x01\x00" + json.dumps([{"path": "/abs"}, {"path": "a/../b"}, {"path": ""},
                                             {"size": -1, "path": "x"}]).encode(),
        "tree-4": b'\x01\x00{"path":"x"}',
        "tree-5": b'\x01\x00[{"type":"file","path":"a.json","path":"b.json","size":1}]',  # a repeated key
        "tree-6": b'\x01\x00' + json.dumps([{"type": "file", "path": "a\x1b[2Jb.json", "size": 1}]).encode(),
        "rev-4": ('\x00{"sha":"%s","sha":"%s"}' % (sha, sha)).encode(),
    }
    for name, data in hub.items():
        write("fuzz_hub_json", name, data)


if __name__ == "__main__":
    main()
