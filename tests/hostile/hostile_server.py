#!/usr/bin/env python3
"""Hostile servers of weightlift's tests, on loopback (stdlib only).

One process, three ports chosen by the OS:
  main    speaks the S3, Hub and plain-HTTP protocols, each case under its
          own path prefix, so one server serves every test:
            /s3/<case>      an S3 endpoint (path-style, no signatures: use
                            AWS_NO_SIGN_REQUEST=1); bucket "b", model prefix "m/"
            /hub/<case>     a Hub endpoint; repository "org/m", revision main
            /http/<case>/   plain files (http(s):// sources)
            /ms/<case>      a ModelScope endpoint (api/v1/models/org/m/repo[/files])
  other   "another host" (a CDN): cross-host redirects land here
  silent  accepts connections, reads the request, and never answers

The model every case starts from: m/model.safetensors with a 16-byte tensor
"small" then a 256 KiB tensor "big" (F32), so that a 64 KiB stream block
reads "big" in several reads. What each case breaks is in CASES below.

Run: hostile_server.py --port-file FILE [--parent-pid PID]
(writes "MAIN OTHER SILENT\\n" to FILE once listening; stops on SIGTERM, or
when the parent is gone, or after an hour).
Hook: GET /_wl/log on the main port returns the request log as JSON
(method, path, Authorization header, every header's name, port name) and
clears it.
"""
import argparse
import hashlib
import json
import os
import signal
import socket
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TIB = 1 << 40
BIG = 256 * 1024
TOKEN = "hf_hostile_test_token"


def safetensors(tensors):
    """[(name, nbytes)] -> file bytes; F32 tensors filled with a byte pattern."""
    header, off = {}, 0
    for name, n in tensors:
        header[name] = {"dtype": "F32", "shape": [n // 4], "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    data = bytes(i % 251 for i in range(off))
    return struct.pack("<Q", len(h)) + h + data


MODEL = safetensors([("small", 16), ("big", BIG)])
# MODEL's header is 128 bytes: its first byte, 0x80, is also a pickle's, and a URL
# with a query is sniffed (no extension to go by). This one's is not.
PRESIGNED_MODEL = safetensors([("w", 16)])
HEADER_END = 8 + struct.unpack("<Q", MODEL[:8])[0]
BIG_START = HEADER_END + 16


def huge_model():
    """A header declaring a 4 TiB tensor; the object claims the matching size."""
    body_len = 4 * TIB
    header = {"huge": {"dtype": "U8", "shape": [body_len], "data_offsets": [0, body_len]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    prefix = struct.pack("<Q", len(h)) + h
    return prefix, len(prefix) + body_len


HUGE_PREFIX, HUGE_SIZE = huge_model()
CONFIG = b'{"architectures": ["Hostile"]}\n'


def git_sha1(b):
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


COMMIT = hashlib.sha1(b"hostile").hexdigest()
# Other bytes of the model's length: what a hostile mirror's CDN, or an update upstream, serves.
OTHER_MODEL = MODEL[:-4] + bytes(b ^ 0xFF for b in MODEL[-4:])


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def b64(raw):
    import base64
    return base64.b64encode(raw).decode()


def object_checksums(data):
    """The headers object stores vouch for `data` with (base64, big-endian CRCs)."""
    import zlib
    return {"crc32c": b64(struct.pack(">I", crc32c(data))), "crc32": b64(struct.pack(">I", zlib.crc32(data))),
            "sha256": b64(hashlib.sha256(data).digest()), "md5": b64(hashlib.md5(data).digest())}


CHECKSUMS = {}  # filled lazily: the pure-Python CRC-32C of the model takes a moment


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.log = []
        self.ports = {}
        self.stop = threading.Event()
        self.counter = 0
        self.silent_accepts = 0

    def record(self, port_name, handler):
        with self.lock:
            if len(self.log) < 10000:
                self.log.append({"port": port_name, "method": handler.command, "path": handler.path,
                                 "auth": handler.headers.get("Authorization", ""),
                                 "headers": [k.lower() for k in handler.headers.keys()]})

    def next(self):
        with self.lock:
            self.counter += 1
            return self.counter


def make_handler(state, port_name):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "wl-hostile/1"

        def log_message(self, *args):
            pass

        # ---- plumbing
        def send(self, code, body=b"", headers=None, length=None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD" and body:
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

        def json(self, code, obj, headers=None):
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            self.send(code, json.dumps(obj).encode(), h)

        def redirect(self, location, extra=None):
            h = {"Location": location}
            h.update(extra or {})
            self.send(302, b"", h)

        def ranged(self, data, size=None, headers=None, fill=None):
            """Serve `data` (or a virtual object of `size` bytes: `data` then `fill` bytes) with Range."""
            size = len(data) if size is None else size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            status = 200
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                start = int(a)
                end = min(int(b), size - 1) if b else size - 1
                status = 206
                if start >= size:
                    return self.send(416, b"", {"Content-Range": "bytes */%d" % size})
            h = dict(headers or {})
            h["Accept-Ranges"] = "bytes"
            h.setdefault("ETag", '"%s"' % hashlib.md5(data).hexdigest())
            if status == 206:
                h["Content-Range"] = "bytes %d-%d/%d" % (start, end, size)
            self.send_response(status)
            for k, v in h.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            if self.command == "HEAD":
                return
            pos = start
            try:
                while pos <= end and not state.stop.is_set():
                    if pos < len(data):
                        chunk = data[pos:min(end + 1, len(data), pos + (1 << 20))]
                    else:
                        chunk = (fill or b"\0") * min(end + 1 - pos, 1 << 20)
                    self.wfile.write(chunk)
                    pos += len(chunk)
            except OSError:
                pass

        # ---- dispatch
        def do_GET(self):
            self.dispatch()

        def do_HEAD(self):
            self.dispatch()

        def dispatch(self):
            state.record(port_name, self)
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.split("/")
            query = urllib.parse.parse_qs(url.query)
            if url.path == "/_wl/log":
                with state.lock:
                    log, state.log = state.log, []
                return self.json(200, log)
            if url.path == "/_wl/silent":  # connections the silent port accepted so far
                return self.json(200, {"accepts": state.silent_accepts})
            if port_name == "other":
                return self.other(url.path, query)
            if len(parts) < 3:
                return self.send(404)
            kind, case, rest = parts[1], parts[2], "/".join(parts[3:])
            if kind == "s3":
                return self.s3(case, rest, query)
            if kind == "hub":
                return self.hub(case, rest, query)
            if kind == "http":
                return self.http(case, rest)
            if kind == "ms":
                return self.modelscope(case, rest, query)
            self.send(404)

        # ---- "another host"
        def other(self, path, query):
            if path.startswith("/blob/"):
                name = path[len("/blob/"):]
                if name == "model.safetensors":
                    return self.ranged(MODEL)
                if name == "config.json":
                    return self.ranged(CONFIG, headers={"ETag": '"%s"' % git_sha1(CONFIG)})
                if name == "trickle":
                    return self.trickle(MODEL)
                if name == "other-model.safetensors":  # a mirror's CDN: other bytes, the right length
                    return self.ranged(OTHER_MODEL)
            if path.startswith("/back/"):  # a redirect back to the main host (token must stay dropped)
                return self.redirect("http://127.0.0.1:%d/%s" % (state.ports["main"], path[len("/back/"):]))
            self.send(404)

        def trickle(self, data):
            """One byte every 0.3 s, whatever the range."""
            rng = self.headers.get("Range")
            start, end = 0, len(data) - 1
            status = 200
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                start, end, status = int(a), min(int(b), len(data) - 1) if b else len(data) - 1, 206
            self.send_response(status)
            self.send_header("Content-Length", str(end - start + 1))
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            try:
                for i in range(start, end + 1):
                    if state.stop.is_set():
                        break
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.3)
            except OSError:
                pass
            self.close_connection = True

        # ---- plain HTTP files
        def http(self, case, rest):
            if case == "redirect-file":
                return self.redirect("file:///etc/passwd")
            if case == "redirect-gopher":
                return self.redirect("gopher://127.0.0.1:%d/_hello" % state.ports["silent"])
            if case == "redirect-loop":
                return self.redirect("/http/redirect-loop/%s?n=%d" % (rest, state.next()))
            if case == "huge-tensor":
                return self.ranged(HUGE_PREFIX, size=HUGE_SIZE)
            if case == "ok":
                return self.ranged(MODEL)
            if case == "presigned":  # read without its extension (a query follows): its header is not 128 bytes
                return self.ranged(PRESIGNED_MODEL)
            if case == "trickle":
                return self.trickle(MODEL)
            self.send(404)

        # ---- S3
        def s3(self, case, rest, query):
            bucket, _, key = rest.partition("/")
            if bucket != "b":
                return self.send(404, b"<Error><Code>NoSuchBucket</Code><Message>no</Message></Error>")
            if not key:
                return self.s3_list(case, query)
            if case == "huge-tensor" and key == "m/model.safetensors":
                return self.ranged(HUGE_PREFIX, size=HUGE_SIZE)
            if case == "framing" and key == "m/model.safetensors" and self.command == "GET":
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes="):
                    a, _, b = rng[6:].partition("-")
                    if int(b or len(MODEL) - 1) >= BIG_START + BIG // 2:  # the second half of "big": a wrong frame
                        return self.send(206, b"x", {"Content-Range": "bytes 0-0/%d" % len(MODEL)})
            if case == "huge-error":
                return self.s3_error_huge()
            files = self.s3_files(case)
            if key in files:
                return self.ranged(files[key], headers=self.s3_checksum_headers(case, files[key]))
            self.send(404, b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>",
                      {"Content-Type": "application/xml"})

        def s3_error_huge(self):
            """403 with a 64 MiB body (the client keeps what a message needs)."""
            self.send_response(403)
            self.send_header("Content-Length", str(64 << 20))
            self.end_headers()
            if self.command == "HEAD":
                return
            try:
                self.wfile.write(b"<Error><Code>AccessDenied</Code><Message>" + b"x" * 1000 + b"</Message></Error>")
                for _ in range(64):
                    self.wfile.write(b" " * (1 << 20))
            except OSError:
                pass

        def s3_checksum_headers(self, case, data):
            """sum-<algorithm>[-bad]: S3's x-amz-checksum-*; goog[-bad]: GCS's x-goog-hash; etag-bad: a wrong
            MD5 ETag; multipart: a '<hex>-2' ETag (nothing to check); composite: a multipart checksum."""
            if not case.startswith(("sum-", "goog", "etag-bad", "multipart", "composite")):
                return None
            if "x" not in CHECKSUMS:
                CHECKSUMS["x"] = (object_checksums(MODEL), object_checksums(OTHER_MODEL))
            good, bad = CHECKSUMS["x"]
            sums = bad if case.endswith("-bad") else good
            md5 = hashlib.md5(OTHER_MODEL if case == "etag-bad" else data).hexdigest()
            h = {"ETag": '"%s"' % md5}
            if case.startswith("sum-"):
                alg = case.split("-")[1]
                h["x-amz-checksum-" + alg] = sums[alg]
                h["x-amz-checksum-type"] = "FULL_OBJECT"
            elif case.startswith("goog"):
                h["x-goog-hash"] = "crc32c=%s,md5=%s" % (sums["crc32c"], sums["md5"])
            elif case == "multipart":
                h["ETag"] = '"%s-2"' % md5
            elif case == "composite":
                h["ETag"] = '"%s-2"' % md5
                h["x-amz-checksum-crc32c"] = bad["crc32c"] + "-2"
                h["x-amz-checksum-type"] = "COMPOSITE"
            return h

        def s3_files(self, case):
            files = {"m/model.safetensors": MODEL}
            if case == "nested":
                files.update({"m/config.json": CONFIG, "m/sub/tokenizer.json": b"{}", "m/notes/changelog.txt": b"notes",
                              "m/sub/deeper/special.txt": b"t", "m/training_args.bin": b"bin"})
            return files

        def s3_list(self, case, query):
            token = query.get("continuation-token", [""])[0]
            prefix = query.get("prefix", [""])[0]
            delim = query.get("delimiter", [""])[0]
            keys, prefixes, truncated, nxt = [], [], False, ""
            if case == "endless-empty":
                truncated, nxt = True, "t%d" % state.next()
            elif case == "endless-keys":
                truncated, nxt = True, "t%d" % state.next()
                keys = [("m/f%d.txt" % state.next(), 1)]
            elif case == "repeat-token":
                truncated, nxt = True, "same"
                keys = [("m/f%d.txt" % state.next(), 1)] if token else []
            else:
                files = self.s3_files(case)
                names = dict((k, len(v)) for k, v in files.items())
                if case == "huge-tensor":
                    names["m/model.safetensors"] = HUGE_SIZE
                if case == "backslash":
                    names["m/evil\\x.json"] = 2
                if case == "dotdot":
                    names["m/../escape.json"] = 2
                if case == "doubleslash":
                    names = {"m//model.safetensors": len(MODEL)}
                for k in sorted(names):
                    if not k.startswith(prefix):
                        continue
                    rest = k[len(prefix):]
                    if delim and delim in rest:
                        p = prefix + rest.split(delim)[0] + delim
                        if p not in prefixes:
                            prefixes.append(p)
                        continue
                    keys.append((k, names[k]))
            body = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
                    "<ListBucketResult><Name>b</Name><Prefix>%s</Prefix>" % prefix,
                    "<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false")]
            if nxt:
                body.append("<NextContinuationToken>%s</NextContinuationToken>" % nxt)
            for k, n in keys:
                body.append("<Contents><Key>%s</Key><Size>%d</Size></Contents>" % (k.replace("&", "&amp;"), n))
            for p in prefixes:
                body.append("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % p)
            body.append("</ListBucketResult>")
            self.send(200, "".join(body).encode(), {"Content-Type": "application/xml"})

        # ---- Hub
        def hub(self, case, rest, query):
            if case == "huge-headers":
                self.send_response(200)
                for i in range(4000):  # ~1 MiB of header lines
                    self.send_header("X-Pad-%d" % i, "p" * 250)
                self.send_header("Content-Length", "2")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(b"{}")
                return
            if case == "huge-json" and rest.startswith("api/"):
                n = 100 << 20
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if "chunked" not in query:
                    self.send_header("Content-Length", str(n))
                    self.end_headers()
                else:  # no length announced: the write callback has to stop it
                    self.close_connection = True
                    self.end_headers()
                try:
                    self.wfile.write(b'{"sha": "' + b"0" * 40 + b'", "siblings": [')
                    for _ in range(100):
                        self.wfile.write(b" " * (1 << 20))
                except OSError:
                    pass
                self.close_connection = True
                return
            if case == "huge-error":
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", str(64 << 20))
                self.end_headers()
                try:
                    for _ in range(64):
                        self.wfile.write(b" " * (1 << 20))
                except OSError:
                    pass
                return
            if rest.startswith("api/models/org/m/revision/"):
                if case == "dupkey-revision":  # two commits: which one is it?
                    body = '{"sha":"%s","sha":"%s","siblings":[]}' % (COMMIT, "1" * 40)
                    return self.send(200, body.encode(), {"Content-Type": "application/json"})
                if case == "error-esc":  # a failing Hub whose error names carry ESC and BEL
                    return self.json(500, {"error": "down" + ESC_BEL}, {"X-Error-Message": "down" + ESC_BEL})
                return self.json(200, {"sha": COMMIT, "siblings": [{"rfilename": "config.json"},
                                                                  {"rfilename": "model.safetensors"}]})
            if rest.startswith("api/models/org/m/tree/"):
                return self.hub_tree(case, query)
            if rest.startswith("org/m/resolve/"):
                fname = rest.split("/", 4)[-1]
                return self.hub_resolve(case, fname)
            self.json(404, {"error": "no"}, {"X-Error-Code": "RepoNotFound"})

        def hub_tree(self, case, query):
            cursor = int(query.get("cursor", ["0"])[0] or 0)
            base = "http://127.0.0.1:%d/hub/%s/api/models/org/m/tree/main" % (state.ports["main"], case)
            if case.startswith("ctlname-"):  # a file name holding a control character (CTL_CHARS)
                e = {"type": "file", "oid": git_sha1(CONFIG), "size": len(CONFIG),
                     "path": "a%sb.json" % CTL_CHARS[case[len("ctlname-"):]]}
                return self.json(200, [e] + self.hub_entries())
            if case == "link-esc":  # the next page on another host, its URL holding ESC and BEL
                return self.json(200, self.hub_entries(),
                                 {"Link": '<http://evil.example%s/tree?cursor=1>; rel="next"' % ESC_BEL})
            if case == "dupkey-tree":  # an entry that names two paths: which one is it?
                body = ('[{"type":"file","oid":"%s","size":%d,"path":"config.json","path":"model.safetensors"}]'
                        % (git_sha1(CONFIG), len(CONFIG)))
                return self.send(200, body.encode(), {"Content-Type": "application/json"})
            if case == "tree-endless":  # empty pages, each linking to a new cursor
                return self.json(200, [], {"Link": '<%s?cursor=%d>; rel="next"' % (base, cursor + 1)})
            if case == "tree-endless-entries":  # one new entry a page, forever
                e = {"type": "file", "oid": "0" * 40, "size": 1, "path": "f%d.txt" % cursor}
                return self.json(200, [e], {"Link": '<%s?cursor=%d>; rel="next"' % (base, cursor + 1)})
            if case == "mirror-nohash":  # a listing that vouches for nothing
                return self.json(200, [{"type": "file", "oid": "", "size": len(MODEL), "path": "model.safetensors"}])
            self.json(200, self.hub_entries())

        def hub_entries(self):
            return [{"type": "file", "oid": git_sha1(CONFIG), "size": len(CONFIG), "path": "config.json"},
                    {"type": "file", "oid": git_sha1(MODEL), "size": len(MODEL), "path": "model.safetensors",
                     "lfs": {"oid": hashlib.sha256(MODEL).hexdigest(), "size": len(MODEL), "pointerSize": 134}}]

        def hub_resolve(self, case, fname):
            common = {"X-Repo-Commit": COMMIT}
            sha = hashlib.sha256(MODEL).hexdigest()
            lfs = dict(common, **{"ETag": '"%s"' % git_sha1(MODEL), "X-Linked-Etag": '"%s"' % sha,
                                  "X-Linked-Size": str(len(MODEL))})
            other = "http://127.0.0.1:%d" % state.ports["other"]
            if case.startswith("redirect-") and fname == "model.safetensors":
                scheme = case[len("redirect-"):]
                targets = {"file": "file:///etc/passwd", "ftp": "ftp://127.0.0.1:%d/x" % state.ports["silent"],
                           "gopher": "gopher://127.0.0.1:%d/_x" % state.ports["silent"],
                           "dict": "dict://127.0.0.1:%d/d:x" % state.ports["silent"]}
                if scheme in targets:
                    return self.redirect(targets[scheme], lfs)
            if case == "etag-esc" and fname == "model.safetensors":  # an ETag that is a terminal sequence
                return self.redirect(other + "/blob/model.safetensors", dict(lfs, **{"X-Linked-Etag": ESC_BEL}))
            if case == "location-esc" and fname == "model.safetensors":  # a non-http Location holding ESC and BEL
                return self.redirect("file:///etc/passwd" + ESC_BEL, lfs)
            if case == "redirect-loop" and fname == "model.safetensors":
                return self.redirect(other + "/back/hub/redirect-loop/org/m/resolve/main/model.safetensors", lfs)
            if case == "linked-size" and fname == "model.safetensors":
                return self.redirect(other + "/blob/model.safetensors", dict(lfs, **{"X-Linked-Size": str(TIB)}))
            if case == "linked-size-absurd" and fname == "model.safetensors":
                return self.redirect(other + "/blob/model.safetensors",
                                     dict(lfs, **{"X-Linked-Size": "9000000000000000000"}))
            # An HF-compatible mirror whose ETag is no hash while its tree lists the real lfs.oid; "-good"
            # serves the model's bytes, the others other bytes of the right length from its CDN.
            md5 = hashlib.md5(MODEL).hexdigest()
            mirror_etags = {"mirror-md5": md5, "mirror-md5-good": md5, "mirror-multipart": md5 + "-2",
                            "mirror-63hex": sha[:63], "mirror-nohash": md5}
            if case in mirror_etags and fname == "model.safetensors":
                blob = "model.safetensors" if case == "mirror-md5-good" else "other-model.safetensors"
                return self.redirect(other + "/blob/" + blob, dict(common, **{"ETag": '"%s"' % mirror_etags[case],
                                                                              "X-Linked-Size": str(len(MODEL))}))
            if case == "mirror-contradict" and fname == "model.safetensors":  # a hash ETag the tree contradicts
                return self.redirect(other + "/blob/other-model.safetensors",
                                     dict(lfs, **{"X-Linked-Etag": '"%s"' % hashlib.sha256(OTHER_MODEL).hexdigest()}))
            if case == "trickle" and fname == "model.safetensors":
                return self.redirect(other + "/blob/trickle", lfs)
            if case == "nonlfs-crosshost" and fname == "config.json":  # a regular file served by another host
                return self.redirect(other + "/blob/config.json", dict(common, **{"ETag": '"%s"' % git_sha1(CONFIG)}))
            if case == "token":  # hub -> other host -> back to the hub: the token must not come back either
                if fname == "model.safetensors":
                    if self.headers.get("Authorization") != "Bearer " + TOKEN:
                        return self.json(401, {"error": "gated"}, {"X-Error-Code": "GatedRepo"})
                    return self.redirect(other + "/back/hub/token/org/m/resolve/main/cdn/model.safetensors", lfs)
            if fname == "model.safetensors":
                if self.command == "HEAD":
                    return self.redirect(other + "/blob/model.safetensors", lfs)
                return self.redirect(other + "/blob/model.safetensors", lfs)
            if fname == "config.json":
                return self.ranged(CONFIG, headers=dict(common, **{"ETag": '"%s"' % git_sha1(CONFIG)}))
            if fname.startswith("cdn/"):  # reached through the redirect back (token case)
                return self.ranged(MODEL, headers={"ETag": '"%s"' % sha})
            self.json(404, {"error": "no"}, dict(common, **{"X-Error-Code": "EntryNotFound"}))

        # ---- ModelScope
        def modelscope(self, case, rest, query):
            """ok: the model; stale: the model updated upstream (other bytes, same size); wrong-bytes: listed
            as the model, serves other bytes; size-<n>: the listing's Size is n (2^62, 1e15, -1); message-esc:
            the server's Message is a terminal sequence; ctlname: a Path holding one; dupkey: a file listed
            with two Paths."""
            if not rest.startswith("api/v1/models/org/m/repo"):
                return self.json(404, {"Code": 404, "Message": "no such model"})
            data = OTHER_MODEL if case in ("stale", "wrong-bytes") else MODEL
            listed = MODEL if case == "wrong-bytes" else data
            size = len(listed)
            if case.startswith("size-"):
                size = {"size-2p62": 1 << 62, "size-1e15": 10 ** 15, "size-neg": -1}[case]
            if rest.endswith("repo/files"):
                if case == "message-esc":
                    return self.json(200, {"Code": 403, "Message": "denied" + ESC_BEL})
                if case == "dupkey":
                    body = ('{"Code":200,"Data":{"Files":[{"Path":"config.json","Path":"evil.json","Type":"blob",'
                            '"Size":%d}]}}' % len(CONFIG))
                    return self.send(200, body.encode(), {"Content-Type": "application/json"})
                files = [{"Path": "model.safetensors", "Type": "blob", "Size": size,
                          "Sha256": hashlib.sha256(listed).hexdigest()},
                         {"Path": "config.json", "Type": "blob", "Size": len(CONFIG),
                          "Sha256": hashlib.sha256(CONFIG).hexdigest()}]
                if case == "ctlname":
                    files.append({"Path": "a%sb.json" % ESC_BEL, "Type": "blob", "Size": 2, "Sha256": "0" * 64})
                return self.json(200, {"Code": 200, "Data": {"Files": files}})
            path = query.get("FilePath", [""])[0]
            if path == "config.json":
                return self.ranged(CONFIG)
            if path == "model.safetensors":
                return self.ranged(data)
            self.json(404, {"Code": 404, "Message": "no such file"})

    return Handler


# Text a hostile server puts where a name or a message goes.
ESC_BEL = "\x1b]0;pwned\x07\x1b[2J"
CTL_CHARS = {"lf": "\n", "cr": "\r", "tab": "\t", "esc": "\x1b", "del": "\x7f", "c1": "\x9b"}


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that hangs up early is what the tests do on purpose


def silent_loop(sock, state):
    conns = []
    sock.settimeout(0.2)
    while not state.stop.is_set():
        try:
            c, _ = sock.accept()
            with state.lock:
                state.silent_accepts += 1
            conns.append(c)  # read nothing back, answer nothing; closed at exit
        except socket.timeout:
            continue
        except OSError:
            break
    for c in conns:
        c.close()


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--parent-pid", type=int, default=0)
    args = ap.parse_args()
    state = State()
    servers = {}
    for name in ("main", "other"):
        s = QuietServer(("127.0.0.1", 0), make_handler(state, name))
        s.daemon_threads = True
        s.block_on_close = False
        servers[name] = s
        state.ports[name] = s.server_address[1]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    state.ports["silent"] = silent.getsockname()[1]
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
               for s in servers.values()]
    threads.append(threading.Thread(target=silent_loop, args=(silent, state), daemon=True))
    for t in threads:
        t.start()
    signal.signal(signal.SIGTERM, lambda *_: state.stop.set())
    signal.signal(signal.SIGINT, lambda *_: state.stop.set())
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d %d\n" % (state.ports["main"], state.ports["other"], state.ports["silent"]))
    os.replace(tmp, args.port_file)
    deadline = time.monotonic() + 3600
    while not state.stop.is_set() and time.monotonic() < deadline and (not args.parent_pid or _alive(args.parent_pid)):
        state.stop.wait(0.5)
    state.stop.set()
    for s in servers.values():
        s.shutdown()
        s.server_close()
    silent.close()


if __name__ == "__main__":
    main()
