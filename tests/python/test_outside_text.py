"""What a server, a mirror or a file chooses never acts on the terminal, never
reveals a secret, never reaches the wire as a header, never hangs a reader
and never reads two ways (issue 30, items 4-7), through the CLI and the Python
API, against the hostile loopback servers of tests/hostile/hostile_server.py.

Every command's stdout and stderr are checked byte by byte: no C0 byte but the
newline, no DEL, no C1 character, no bidi control (assert_inert)."""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import CLI, ROOT

HOSTILE = ROOT / "tests" / "hostile" / "hostile_server.py"
ESC_BEL = "\x1b]0;pwned\x07\x1b[2J"           # what the server sends
ESC_BEL_SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"  # what the user sees

# Bytes a terminal acts on: C0 but LF, DEL, C1 (UTF-8), bidi and line controls (UTF-8).
RAW = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def assert_inert(*outputs: bytes):
    for out in outputs:
        m = RAW.search(out)
        assert m is None, f"raw control byte {m.group()!r} at {m.start()} in {out[:2000]!r}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    port_file = tmp_path_factory.mktemp("hostile") / "ports"
    p = subprocess.Popen([sys.executable, str(HOSTILE), "--port-file", str(port_file), "--parent-pid",
                          str(os.getpid())])
    for _ in range(600):
        if port_file.exists():
            break
        time.sleep(0.05)
    main, other, silent = map(int, port_file.read_text().split())
    yield {"main": main, "other": other, "base": f"http://127.0.0.1:{main}"}
    p.terminate()
    p.wait(timeout=30)


def server_log(hostile):
    import urllib.request
    with urllib.request.urlopen(hostile["base"] + "/_wl/log", timeout=10) as r:
        return json.load(r)


def wl(tmp_path, *args, env=None, timeout=120):
    """Runs the CLI with a clean Hub/ModelScope environment; bytes out, nothing decoded."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("HF_", "HUGGING", "MODELSCOPE", "VLLM_USE_MODELSCOPE", "AWS_", "WEIGHTLIFT_"))}
    e.update({"HF_HOME": str(tmp_path / "hf-home"), "WEIGHTLIFT_RETRIES": "0", "WEIGHTLIFT_CONNECT_TIMEOUT": "5",
              "WEIGHTLIFT_STALL_TIMEOUT": "5"})
    e.update(env or {})
    return subprocess.run([CLI, *map(str, args)], capture_output=True, env=e, timeout=timeout)


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def raw_safetensors(header_text: str, data: bytes) -> bytes:
    h = header_text.encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def files_under(folder):
    out = []
    for root, dirs, files in os.walk(folder):
        out += [os.path.join(root, n) for n in dirs + files]
    return out


# ---- item 4: names with control characters are refused before anything is written ----

@pytest.mark.parametrize("kind", ["lf", "cr", "tab", "esc", "del", "c1"])
def test_a_hub_name_with_a_control_character_is_refused_before_anything_is_written(hostile, tmp_path, kind):
    cache = tmp_path / "cache"
    r = wl(tmp_path, "download", "org/m", "--cache-dir", cache, "-q",
           env={"HF_ENDPOINT": f"{hostile['base']}/hub/ctlname-{kind}"})
    assert r.returncode == 1, r.stderr
    assert_inert(r.stdout, r.stderr)
    assert b"refusing repository file name 'a\\x" in r.stderr or b"refusing repository file name 'a\\u009b" in r.stderr
    assert b"control character" in r.stderr
    written = files_under(cache)
    assert not [p for p in written if RAW.search(os.fsencode(p))], written
    assert not [p for p in written if "snapshots" in p and os.path.isfile(p)], written


def test_a_modelscope_name_with_a_control_character_is_refused(hostile, tmp_path):
    cache = tmp_path / "ms"
    r = wl(tmp_path, "download", "org/m", "-q", env={"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_CACHE": str(cache),
                                                     "MODELSCOPE_DOMAIN": f"{hostile['base']}/ms/ctlname"})
    assert r.returncode == 1, r.stderr
    assert_inert(r.stdout, r.stderr)
    assert ESC_BEL_SHOWN.encode() in r.stderr
    assert not [p for p in files_under(cache) if os.path.isfile(p)]


# ---- item 4: server- and file-chosen text reaches the terminal inert ----

@pytest.mark.parametrize("case,expect", [
    ("etag-esc", "unsafe as a file name"),      # an ETag that is a terminal sequence
    ("link-esc", "points to another host"),     # a cross-host Link
    ("location-esc", "not http or https"),      # a non-http Location
])
def test_hub_text_in_errors_is_escaped(hostile, tmp_path, case, expect):
    r = wl(tmp_path, "download", "org/m", "--cache-dir", tmp_path / "c", "-q",
           env={"HF_ENDPOINT": f"{hostile['base']}/hub/{case}"})
    assert r.returncode == 1, r.stderr
    assert_inert(r.stdout, r.stderr)
    assert expect.encode() in r.stderr, r.stderr
    assert ESC_BEL_SHOWN.encode() in r.stderr, r.stderr


def test_a_modelscope_message_is_escaped(hostile, tmp_path):
    r = wl(tmp_path, "download", "org/m", "-q", env={"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_CACHE": str(tmp_path),
                                                     "MODELSCOPE_DOMAIN": f"{hostile['base']}/ms/message-esc"})
    assert r.returncode == 1, r.stderr
    assert_inert(r.stdout, r.stderr)
    assert ("denied" + ESC_BEL_SHOWN).encode() in r.stderr, r.stderr


EVIL_NAMES = ["a\x1b]0;pwned\x07b", "line\nbreak", "c1\u009b31m", "bidi\u202eevil", "del\x7f"]


@pytest.fixture
def evil_file(tmp_path):
    header, data, off = {}, b"", 0
    for i, n in enumerate(EVIL_NAMES):
        header[n] = {"dtype": "U8", "shape": [2], "data_offsets": [off, off + 2]}
        data += bytes([i, i])
        off += 2
    path = tmp_path / "evil.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    return path


def test_tensor_names_in_ls_and_load_tables_are_escaped_and_jsonl_is_exact(tmp_path, evil_file):
    t = wl(tmp_path, "ls", evil_file)
    assert t.returncode == 0, t.stderr
    assert_inert(t.stdout, t.stderr)
    assert b"a\\x1b]0;pwned\\x07b" in t.stdout and b"bidi\\u202eevil" in t.stdout
    j = wl(tmp_path, "ls", evil_file, "--format", "jsonl")
    assert j.returncode == 0, j.stderr
    assert_inert(j.stdout, j.stderr)
    assert sorted(json.loads(line)["name"] for line in j.stdout.splitlines()) == sorted(EVIL_NAMES)
    c = wl(tmp_path, "load", evil_file, "--checksum", "--no-progress")
    assert c.returncode == 0, c.stderr
    assert_inert(c.stdout, c.stderr)
    cj = wl(tmp_path, "load", evil_file, "--checksum", "--format", "jsonl", "--no-progress", "--verbose")
    assert cj.returncode == 0, cj.stderr
    assert_inert(cj.stdout, cj.stderr)
    assert sorted(json.loads(line)["name"] for line in cj.stdout.splitlines()) == sorted(EVIL_NAMES)


def test_a_tensor_name_in_a_load_error_is_escaped(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes({"w" + ESC_BEL: {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"))
    for cmd in (["ls", path], ["load", path, "--no-progress"]):
        r = wl(tmp_path, *cmd)
        assert r.returncode == 1, r.stderr
        assert_inert(r.stdout, r.stderr)
        assert ("tensor 'w" + ESC_BEL_SHOWN + "'").encode() in r.stderr, r.stderr


def test_python_exceptions_carry_inert_text(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes({"w" + ESC_BEL: {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"))
    import weightlift
    from weightlift import _text, weight_utils
    from weightlift.safetensors import SafetensorError, safe_open
    from weightlift.safetensors.torch import load_file
    with pytest.raises(SafetensorError) as e:
        safe_open(str(path), "pt")
    assert ESC_BEL_SHOWN in str(e.value) and not RAW.search(str(e.value).encode())
    with pytest.raises(SafetensorError) as e:
        load_file(str(path))
    assert ESC_BEL_SHOWN in str(e.value) and not RAW.search(str(e.value).encode())
    with pytest.raises(weightlift.CorruptDataError) as e:  # the engine's own exception
        weight_utils.filter_duplicate_safetensors_files([str(path)], str(tmp_path), "bad.safetensors")
    assert not RAW.search(str(e.value).encode())
    # The Python twin is the engine's function: the same rendering.
    assert _text.inert("a" + ESC_BEL + " http://u:pw@h/?sig=S") == "a" + ESC_BEL_SHOWN + " http://***@h/?sig=***"


# ---- item 5: secrets are never printed ----

def test_a_urls_password_is_never_printed(hostile, tmp_path):
    port = hostile["main"]
    cases = [
        (["ls", f"http://alice:PASSWORD123@127.0.0.1:{port}/http/missing/model.safetensors"], {}),
        (["download", "org/m", "--cache-dir", tmp_path / "c", "-q"],
         {"HF_ENDPOINT": f"http://alice:PASSWORD123@127.0.0.1:{port}/hub/error-esc"}),
        (["ls", "s3://nob/m/"], {"AWS_ENDPOINT_URL": f"http://alice:PASSWORD123@127.0.0.1:{port}/s3/x",
                                 "AWS_NO_SIGN_REQUEST": "1"}),
    ]
    for args, env in cases:
        r = wl(tmp_path, *args, env=env)
        assert r.returncode != 0, (args, r.stderr)
        assert b"PASSWORD123" not in r.stdout + r.stderr, r.stderr
        assert b"alice" not in r.stdout + r.stderr, r.stderr
        assert_inert(r.stdout, r.stderr)


def test_a_presigned_urls_signature_is_never_printed(hostile, tmp_path):
    url = (f"{hostile['base']}/http/presigned/model.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256"
           "&X-Amz-Credential=CREDSECRET%2F20260101&X-Amz-Security-Token=TOKSECRET&X-Amz-Signature=SIGSECRET")
    for args in (["ls", url], ["ls", url, "--format", "jsonl"], ["load", url, "--verbose", "--checksum"]):
        r = wl(tmp_path, *args)
        assert r.returncode == 0, r.stderr
        out = r.stdout + r.stderr
        for secret in (b"SIGSECRET", b"CREDSECRET", b"TOKSECRET"):
            assert secret not in out, (args, out)
        if args[0] == "ls":  # the FILE column: the URL, its secrets replaced
            assert b"X-Amz-Signature=***" in r.stdout, r.stdout
    bad = url.replace("/http/presigned/", "/http/missing/")
    r = wl(tmp_path, "ls", bad)
    assert r.returncode == 1
    assert b"SIGSECRET" not in r.stderr and b"CREDSECRET" not in r.stderr, r.stderr


# ---- item 5: a token holding a control character is refused, never sent ----

INJECT = "hf_secretpart\r\nX-Injected: yes"


@pytest.mark.parametrize("source", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "token file", "HF_TOKEN_PATH", "--token",
                                    "MODELSCOPE_API_TOKEN"])
def test_a_token_with_a_line_break_is_refused_naming_its_source(hostile, tmp_path, source):
    env = {"HF_ENDPOINT": f"{hostile['base']}/hub/ok"}
    args = ["download", "org/m", "--cache-dir", tmp_path / "c", "-q"]
    named = source
    if source in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MODELSCOPE_API_TOKEN"):
        env[source] = INJECT
    elif source == "token file":
        (tmp_path / "hf-home").mkdir()
        (tmp_path / "hf-home" / "token").write_text("hf_secretpart\nX-Injected: yes\n")
        named = "the token file " + str(tmp_path / "hf-home" / "token")
    elif source == "HF_TOKEN_PATH":
        (tmp_path / "tok").write_text(INJECT)
        env[source] = str(tmp_path / "tok")
    else:
        args += ["--token", INJECT]
    if source == "MODELSCOPE_API_TOKEN":
        env.update({"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_CACHE": str(tmp_path / "ms"),
                    "MODELSCOPE_DOMAIN": f"{hostile['base']}/ms/ok"})
    server_log(hostile)  # cleared
    r = wl(tmp_path, *args, env=env)
    assert r.returncode == 1, r.stderr
    assert named.encode() in r.stderr, r.stderr
    assert b"secretpart" not in r.stderr and b"Injected" not in r.stderr, r.stderr
    assert_inert(r.stdout, r.stderr)
    log = [e for e in server_log(hostile) if e["path"] != "/_wl/log"]
    assert not [e for e in log if "x-injected" in e["headers"]], log
    assert not [e for e in log if "secretpart" in e["auth"]], log


# ---- item 6: one reading of every document ----

DUPLICATES = {
    "dtype": '{"w":{"dtype":"U8","dtype":"I8","shape":[2],"data_offsets":[0,2]}}',
    "shape": '{"w":{"dtype":"U8","shape":[1],"shape":[2],"data_offsets":[0,2]}}',
    "data_offsets": '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,1],"data_offsets":[0,2]}}',
    "__metadata__": '{"__metadata__":{"k":"1"},"__metadata__":{"k":"2"},"w":{"dtype":"U8","shape":[2],'
                    '"data_offsets":[0,2]}}',
    # safetensors keeps the last of these two; weightlift refuses them (one reading or none)
    "metadata key": '{"__metadata__":{"k":"1","k":"2"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
    "tensor name": '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"I8","shape":[2],'
                   '"data_offsets":[0,2]}}',
}
SAFETENSORS_REFUSES = {"dtype", "shape", "data_offsets", "__metadata__"}


@pytest.mark.parametrize("which", list(DUPLICATES))
def test_a_header_that_repeats_a_key_is_refused_by_every_reader(tmp_path, which):
    path = tmp_path / "dup.safetensors"
    path.write_bytes(raw_safetensors(DUPLICATES[which], b"\1\2"))
    for cmd in (["ls", path], ["load", path, "--no-progress"], ["ls", tmp_path]):
        r = wl(tmp_path, *cmd)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        assert str(path).encode() in r.stderr
    import weightlift.safetensors as wst
    for framework in ("pt", "np"):
        with pytest.raises(wst.SafetensorError) as e:
            with wst.safe_open(str(path), framework) as f:
                [f.get_tensor(k) for k in f.keys()]
        assert "repeat" in str(e.value) or "duplicate" in str(e.value), str(e.value)
    from weightlift.safetensors.numpy import load_file
    with pytest.raises(wst.SafetensorError):
        load_file(str(path))
    try:
        import safetensors
        from safetensors import safe_open
    except ImportError:
        return
    if which in SAFETENSORS_REFUSES:  # the reference agrees
        with pytest.raises(Exception, match="duplicate field"):
            with safe_open(str(path), "np") as f:
                [f.get_tensor(k) for k in f.keys()]
    else:
        print("safetensors", safetensors.__version__, "keeps the last", which)


def test_an_index_that_repeats_a_key_is_refused(tmp_path):
    one = safetensors_bytes({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\1")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(one)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(one)
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map":{"a":"model-00001-of-00002.safetensors","a":"model-00002-of-00002.safetensors"}}')
    r = wl(tmp_path, "ls", tmp_path)
    assert r.returncode == 1 and b"duplicate key 'a'" in r.stderr, r.stderr
    from weightlift import _vllm_extras, weight_utils
    with pytest.raises(ValueError, match="duplicate key"):
        weight_utils.filter_duplicate_safetensors_files([str(tmp_path / "model-00001-of-00002.safetensors")],
                                                        str(tmp_path), "model.safetensors.index.json")
    with pytest.raises(ValueError, match="duplicate key"):
        _vllm_extras.filter_mm_encoder_only_safetensors_files(
            [str(tmp_path / "model-00001-of-00002.safetensors")], str(tmp_path), "model.safetensors.index.json",
            ["language_model."])


@pytest.mark.parametrize("case", ["dupkey-tree", "dupkey-revision"])
def test_a_hub_listing_that_repeats_a_key_is_refused(hostile, tmp_path, case):
    r = wl(tmp_path, "download", "org/m", "--cache-dir", tmp_path / "c", "-q",
           env={"HF_ENDPOINT": f"{hostile['base']}/hub/{case}"})
    assert r.returncode == 1, r.stderr
    assert b"duplicate key" in r.stderr, r.stderr
    assert not [p for p in files_under(tmp_path / "c") if "snapshots" in p and os.path.isfile(p)]


def test_a_modelscope_listing_that_repeats_a_key_is_refused(hostile, tmp_path):
    env = {"VLLM_USE_MODELSCOPE": "1", "MODELSCOPE_CACHE": str(tmp_path / "m"),
           "MODELSCOPE_DOMAIN": f"{hostile['base']}/ms/dupkey"}
    r = wl(tmp_path, "download", "org/m", "-q", env=env)
    assert r.returncode == 1, r.stderr
    assert b"duplicate key 'Path'" in r.stderr, r.stderr
    assert not [p for p in files_under(tmp_path / "m") if os.path.isfile(p)]


# ---- item 7: only regular files are read ----

@pytest.fixture(params=["fifo", "socket", "device"])
def special_model(request, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    weights = folder / "model.safetensors"
    held = None
    if request.param == "fifo":
        os.mkfifo(weights)
        what = b"a FIFO"
    elif request.param == "socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(str(weights))
        what = b"a socket"
    else:
        os.symlink("/dev/zero", weights)
        what = b"a character device"
    yield folder, weights, what
    if held:
        held.close()


def test_a_special_weight_file_is_refused_not_waited_on(tmp_path, special_model):
    folder, weights, what = special_model
    as_bin = tmp_path / "pytorch_model.bin"  # the converter's input, through a symlink
    os.symlink(weights, as_bin)
    for cmd, named in ((["ls", folder], weights), (["ls", weights], weights),
                       (["load", folder, "--no-progress"], weights),
                       (["load", weights, "--no-progress", "--strategy", "eager"], weights),
                       (["convert", as_bin, tmp_path / "o.safetensors"], as_bin)):
        r = wl(tmp_path, *cmd, timeout=60)  # a FIFO used to block here until killed
        assert r.returncode == 1, (cmd, r.stderr)
        assert str(named).encode() in r.stderr and what in r.stderr, (cmd, r.stderr)
        assert b"not a regular file" in r.stderr, (cmd, r.stderr)
    code = ("import sys, weightlift.safetensors as s, weightlift.weight_utils as w\n"
            "try:\n    s.safe_open(sys.argv[1], 'pt')\nexcept Exception as e:\n    print('refused:', e)\n"
            "try:\n    list(w.safetensors_weights_iterator([sys.argv[1]], False))\n"
            "except Exception as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(weights)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("refused:") == 2 and "not a regular file" in r.stdout, r.stdout
