"""The model-utility commands seen from Python: quant-config JSON and
dummy weights that match an independent Philox implementation."""
import hashlib
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

CLI = os.environ.get("WEIGHTLIFT_CLI", str(Path(__file__).resolve().parents[2] / "build" / "bin" / "weightlift"))

M = 0xFFFFFFFF


def philox4x32(counter, seed):
    c = [counter & M, counter >> 32, 0, 0]
    k = [seed & M, seed >> 32]
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & M, p1 & M, ((p0 >> 32) ^ c[3] ^ k[1]) & M, p0 & M]
        k = [(k[0] + 0x9E3779B9) & M, (k[1] + 0xBB67AE85) & M]
    return c


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_f32(n, low=-1e-3, high=1e-3, seed=1234):
    lo, hi = f32(low), f32(high)
    rng = f32(hi - lo)
    out = []
    for i in range(n):
        w = philox4x32(i // 4, seed)[i % 4]
        v = f32(lo + rng * ((w >> 8) / 16777216.0))
        out.append(lo if v >= hi else v)
    return out


def run(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


def test_quant_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    r = run("quant-config", str(tmp_path), "-q", "fp8")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["source"] == "hf_config"
    assert out["config"] == {"quant_method": "fp8"}


def test_dummy_bytes_match_independent_philox(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    np = pytest.importorskip("numpy")
    model = tmp_path / "m"
    model.mkdir()
    safetensors.save_file({"w": np.zeros((3, 5), dtype=np.float32)}, str(model / "model.safetensors"))
    r = run("dummy", str(model), "--hash", "--threads", "3")
    assert r.returncode == 0, r.stderr
    digest = r.stdout.split("sha256 ")[1].split()[0]
    expect = struct.pack("<15f", *expected_f32(15))
    assert digest == hashlib.sha256(expect).hexdigest()
