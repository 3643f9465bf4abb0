#!/usr/bin/env python3
"""A loopback Hugging Face Hub-protocol server for weightlift's tests (stdlib only).

Serves repositories from a local folder, as the Hub's HTTP API and `resolve`
endpoint look to `huggingface_hub` (0.27 and 2.x both work against it):

  ROOT/{org}/{name}/{revision}/...files     one folder per branch or tag
  ROOT/{org}/{name}/.gated                  the repository is gated (needs the token)

Each revision gets a deterministic 40-hex commit sha (sha1 of its revision name and
file list), and `/resolve/{commit}/...` works like a branch name. Files whose
extension is one of LFS_EXTS (or larger than 1 MiB) are LFS files: their ETag is
their SHA-256 and `resolve` redirects them (302) to a second "CDN" port; other files
carry their git blob sha1 as ETag and are served directly.

Listens only on 127.0.0.1 with ports chosen by the OS. Test hooks (hub port):
  POST /_wl/faults   JSON {"mode": ..., "count": N, "path": substring, "retry_after": s}
                     modes: reset (close mid-body), truncate (short body, clean close),
                     500, 429, corrupt (flip a byte: wrong ETag), slow (that response
                     at 16 KiB/s), none
  POST /_wl/rate     JSON {"bytes_per_s": R, "burst": B}  per-connection throttle (0 = off),
                     after B bytes of each response sent at full speed (default 0)
                     (both also as GET with query parameters, e.g. /_wl/rate?bytes_per_s=1000)
  GET  /_wl/stats    JSON: bytes served per path, GET count per path, Authorization
                     headers the CDN saw, all request lines
  POST /_wl/modelscope  (nothing) -- ModelScope API is always on under /api/v1/models
  GET  /_wl/vouch?on=0  a mirror that vouches for no hash (LFS ETags of 32 hex, no X-Linked-Etag,
                     no oid or lfs in the tree): the downloads' unverified path, for bench/integrity

Run standalone: hubserver.py --root DIR --port-file FILE [--token T] [--page-size N]
(writes "HUB_PORT CDN_PORT\n" to FILE once listening; stops on SIGTERM).
"""
import argparse
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_EXTS = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".gguf", ".h5", ".msgpack")
CHUNK = 1024 * 1024
SLOW_RATE = 16 * 1024  # bytes/s of a response the "slow" fault picked


class Repo:
    def __init__(self, root, repo_id):
        self.repo_id = repo_id
        self.dir = os.path.join(root, repo_id)
        self.gated = os.path.exists(os.path.join(self.dir, ".gated"))
        self.revisions = {}  # name -> (commit, {path: FileInfo})
        for rev in sorted(os.listdir(self.dir)):
            rdir = os.path.join(self.dir, rev)
            if rev.startswith(".") or not os.path.isdir(rdir):
                continue
            files = {}
            for base, dirs, names in os.walk(rdir):
                dirs.sort()
                for n in sorted(names):
                    full = os.path.join(base, n)
                    rel = os.path.relpath(full, rdir).replace(os.sep, "/")
                    files[rel] = FileInfo(full)
            manifest_path = os.path.join(self.dir, "." + rev + ".extra.json")
            if os.path.exists(manifest_path):  # extra (possibly hostile) names listed by the API
                with open(manifest_path) as f:
                    for name in json.load(f):
                        files[name] = FileInfo(None)
            h = hashlib.sha1(rev.encode())
            for p in sorted(files):
                h.update(p.encode() + b"\0" + files[p].oid.encode())
            self.revisions[rev] = (h.hexdigest(), files)

    def lookup(self, rev):
        rev = urllib.parse.unquote(rev)
        if rev in self.revisions:
            return self.revisions[rev]
        for commit, files in self.revisions.values():
            if commit == rev:
                return commit, files
        return None


class FileInfo:
    def __init__(self, path):
        self.path = path
        if path is None:
            self.size, self.oid, self.sha256, self.lfs = 0, "0" * 40, "0" * 64, False
            return
        self.size = os.path.getsize(path)
        sha1 = hashlib.sha1(b"blob %d\0" % self.size)
        sha256 = hashlib.sha256()
        with open(path, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                sha1.update(b)
                sha256.update(b)
        self.oid = sha1.hexdigest()
        self.sha256 = sha256.hexdigest()
        self.lfs = path.endswith(LFS_EXTS) or self.size > (1 << 20)

    @property
    def etag(self):
        return self.sha256 if self.lfs else self.oid


class State:
    def __init__(self, root, token, page_size):
        self.root = root
        self.token = token
        self.page_size = page_size
        self.lock = threading.Lock()
        self.repos = {}
        self.fault = {"mode": "none", "count": 0, "path": "", "retry_after": 0}
        self.rate = 0
        self.vouch = True  # /_wl/vouch
        self.burst = 0  # bytes each response sends at full speed before the throttle applies
        self.bytes = {}
        self.gets = {}
        self.cdn_auth = []
        self.requests = []
        self.cdn_port = 0

    def repo(self, repo_id):
        parts = repo_id.split("/")
        if not repo_id or any(p in ("", ".", "..") for p in parts) or len(parts) > 2:
            return None
        with self.lock:
            if repo_id not in self.repos:
                if not os.path.isdir(os.path.join(self.root, repo_id)):
                    return None
                self.repos[repo_id] = Repo(self.root, repo_id)
            return self.repos[repo_id]

    def take_fault(self, path):
        with self.lock:
            f = self.fault
            if f["count"] > 0 and f["mode"] != "none" and f["path"] in path:
                f["count"] -= 1
                return dict(f)
        return None


def make_handler(state, is_cdn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "wl-hubserver/1"

        def log_message(self, fmt, *args):  # quiet
            pass

        def _record(self):
            with state.lock:
                if len(state.requests) < 100000:
                    state.requests.append(("cdn " if is_cdn else "hub ") + self.command + " " + self.path)
                if is_cdn and self.headers.get("Authorization"):
                    state.cdn_auth.append(self.headers.get("Authorization"))

        def _json(self, code, obj, headers=None):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, code, error_code, message, headers=None):
            h = {"X-Error-Code": error_code, "X-Error-Message": message} if error_code else {"X-Error-Message": message}
            h.update(headers or {})
            self._json(code, {"error": message}, h)

        def _authorized(self, repo):
            if not repo.gated:
                return True
            return state.token and self.headers.get("Authorization") == "Bearer " + state.token

        def do_HEAD(self):
            self._dispatch()

        def do_GET(self):
            self._dispatch()

        def do_POST(self):
            self._record()
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path == "/_wl/faults":
                with state.lock:
                    state.fault = {"mode": body.get("mode", "none"), "count": int(body.get("count", 1)),
                                   "path": body.get("path", ""), "retry_after": body.get("retry_after", 0)}
                return self._json(200, {"ok": True})
            if self.path == "/_wl/rate":
                state.rate = int(body.get("bytes_per_s", 0))
                state.burst = int(body.get("burst", 0))
                return self._json(200, {"ok": True})
            if self.path == "/_wl/reset_stats":
                with state.lock:
                    state.bytes, state.gets, state.cdn_auth, state.requests = {}, {}, [], []
                return self._json(200, {"ok": True})
            self._error(404, None, "no such endpoint")

        def _dispatch(self):
            self._record()
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            query = urllib.parse.parse_qs(url.query)
            if is_cdn:
                return self._cdn(path)
            if path == "/_wl/vouch":
                state.vouch = query.get("on", ["1"])[0] != "0"
                return self._json(200, {"ok": True})
            if path in ("/_wl/faults", "/_wl/rate"):  # GET form of the POST hooks (query parameters)
                q = {k: v[0] for k, v in query.items()}
                with state.lock:
                    if path == "/_wl/rate":
                        state.rate = int(q.get("bytes_per_s", 0))
                        state.burst = int(q.get("burst", 0))
                    else:
                        state.fault = {"mode": q.get("mode", "none"), "count": int(q.get("count", 1)),
                                       "path": q.get("path", ""), "retry_after": int(q.get("retry_after", 0))}
                return self._json(200, {"ok": True})
            if path == "/_wl/stats":
                with state.lock:
                    return self._json(200, {"bytes": state.bytes, "gets": state.gets,
                                            "cdn_auth": state.cdn_auth, "requests": state.requests})
            if path.startswith("/api/v1/models/"):
                return self._modelscope(path, query)
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/"):], query)
            if "/resolve/" in path:
                repo_id, rest = path[1:].split("/resolve/", 1)
                rev, _, fname = rest.partition("/")
                return self._resolve(urllib.parse.unquote(repo_id), rev, urllib.parse.unquote(fname))
            self._error(404, None, "no such endpoint")

        # ---- /api/models/{repo}[/revision/{rev}] and /tree/{rev}[/path]
        def _api(self, rest, query):
            rest = urllib.parse.unquote(rest)
            repo_id, kind, rev, sub = rest, None, "main", ""
            for marker in ("/revision/", "/tree/"):
                if marker in rest:
                    repo_id, tail = rest.split(marker, 1)
                    kind = marker.strip("/")
                    rev, _, sub = tail.partition("/")
                    break
            repo = state.repo(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if not self._authorized(repo):
                return self._error(401, "GatedRepo", "Access to model %s is restricted." % repo_id)
            found = repo.lookup(rev)
            if found is None:
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            commit, files = found
            if kind == "tree":
                return self._tree(repo_id, rev, commit, files, sub.strip("/"), query)
            self._json(200, {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit,
                             "private": False, "gated": "manual" if repo.gated else False, "disabled": False,
                             "tags": [], "siblings": [{"rfilename": p} for p in sorted(files)]})

        def _tree(self, repo_id, rev, commit, files, sub, query):
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            entries, dirs = [], set()
            prefix = sub + "/" if sub else ""
            for p in sorted(files):
                if not p.startswith(prefix):
                    continue
                rel = p[len(prefix):]
                if "/" in rel:
                    parts = rel.split("/")
                    for i in range(1, len(parts) if recursive else 2):
                        d = prefix + "/".join(parts[:i])
                        if d not in dirs:
                            dirs.add(d)
                            entries.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(),
                                            "size": 0, "path": d})
                    if not recursive:
                        continue
                fi = files[p]
                e = {"type": "file", "oid": fi.oid if state.vouch else "", "size": fi.size, "path": p}
                if fi.lfs and state.vouch:
                    e["lfs"] = {"oid": fi.sha256, "size": fi.size, "pointerSize": 134}
                entries.append(e)
            start = int(query.get("cursor", ["0"])[0] or 0)
            page = entries[start:start + state.page_size]
            headers = {}
            if start + state.page_size < len(entries):
                q = {"recursive": str(recursive), "cursor": str(start + state.page_size)}
                nxt = "http://127.0.0.1:%d/api/models/%s/tree/%s%s?%s" % (
                    self.server.server_address[1], repo_id, urllib.parse.quote(rev, safe=""),
                    ("/" + sub) if sub else "", urllib.parse.urlencode(q))
                headers["Link"] = '<%s>; rel="next"' % nxt
            self._json(200, page, headers)

        # ---- /{repo}/resolve/{rev}/{file}
        def _resolve(self, repo_id, rev, fname):
            repo = state.repo(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if not self._authorized(repo):
                return self._error(401, "GatedRepo", "Access to model %s is restricted." % repo_id)
            found = repo.lookup(rev)
            if found is None:
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            commit, files = found
            fi = files.get(fname)
            if fi is None:
                return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
            fault = self._fault_status(fname)
            if fault:
                return
            common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
            if fi.lfs:
                loc = "http://127.0.0.1:%d/blobs/%s?repo=%s&sig=loopback" % (
                    state.cdn_port, fi.sha256, urllib.parse.quote(repo_id, safe=""))
                self.send_response(302)
                for k, v in common.items():
                    self.send_header(k, v)
                self.send_header("ETag", '"%s"' % (fi.oid if state.vouch else fi.sha256[:32]))
                if state.vouch:
                    self.send_header("X-Linked-Etag", '"%s"' % fi.sha256)
                self.send_header("X-Linked-Size", str(fi.size))
                self.send_header("Location", loc)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_file(fi, fname, common, '"%s"' % fi.oid)

        def _cdn(self, path):
            if not path.startswith("/blobs/"):
                return self._error(404, None, "no such blob")
            sha = path[len("/blobs/"):]
            with state.lock:
                repos = list(state.repos.values())
            for repo in repos:
                for _, files in repo.revisions.values():
                    for name, fi in files.items():
                        if fi.path and fi.lfs and fi.sha256 == sha:
                            if self._fault_status(name):
                                return
                            return self._send_file(fi, name, {"Accept-Ranges": "bytes"}, '"%s"' % sha)
            self._error(404, None, "no such blob")

        def _fault_status(self, name):
            if self.command != "GET":
                return False
            f = state.take_fault(name)
            if f is None:
                return False
            if f["mode"] in ("500", "429"):
                h = {"Retry-After": str(f["retry_after"])} if f["retry_after"] else {}
                self._error(int(f["mode"]), None, "injected " + f["mode"], h)
                return True
            self._pending_fault = f["mode"]
            return False

        def _send_file(self, fi, name, headers, etag):
            size = fi.size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            status = 200
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                try:
                    start = int(a) if a else 0
                    end = min(int(b), size - 1) if b else size - 1
                except ValueError:
                    start, end = 0, size - 1
                if start >= size and size > 0:
                    self.send_response(416)
                    self.send_header("Content-Range", "bytes */%d" % size)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            length = max(0, end - start + 1)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(length))
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
            self.end_headers()
            if self.command == "HEAD":
                return
            mode = getattr(self, "_pending_fault", None)
            self._pending_fault = None
            with state.lock:
                state.gets[name] = state.gets.get(name, 0) + 1
            limit = length
            if mode in ("reset", "truncate"):
                limit = length // 2
            sent = 0
            t0 = time.monotonic()
            # The throttle: the server-wide rate, or the "slow" fault's for this response alone.
            rate, burst = (SLOW_RATE, 0) if mode == "slow" else (state.rate, state.burst)
            with open(fi.path, "rb") as f:
                f.seek(start)  # the corrupt mode reads; sendfile takes explicit offsets
                while sent < limit:
                    # Throttled: small pieces, each sent only once the rate allows it
                    # (a range of one CHUNK would otherwise leave at full speed).
                    piece = CHUNK if rate <= 0 else max(4096, min(CHUNK, rate // 20))
                    want = min(piece, limit - sent)
                    if rate > 0 and sent + want > burst:
                        ahead = (sent + want - burst) / rate - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
                    try:
                        if mode == "corrupt" and sent == 0:
                            b = f.read(want)
                            if not b:
                                break
                            self.wfile.write(bytes([b[0] ^ 0xFF]) + b[1:])
                            n = len(b)
                        else:  # zero-copy
                            n = os.sendfile(self.connection.fileno(), f.fileno(), start + sent, want)
                            if n == 0:
                                break
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    sent += n
                    with state.lock:
                        state.bytes[name] = state.bytes.get(name, 0) + n
            if mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
            elif mode == "truncate":
                self.close_connection = True

        # ---- ModelScope API (the subset snapshot_download uses)
        def _modelscope(self, path, query):
            rest = urllib.parse.unquote(path[len("/api/v1/models/"):])
            if rest.endswith("/repo/files"):
                repo_id = rest[: -len("/repo/files")]
                mode = "files"
            elif rest.endswith("/repo"):
                repo_id = rest[: -len("/repo")]
                mode = "file"
            else:
                repo_id, mode = rest, "info"
            repo = state.repo(repo_id)
            if repo is None:
                return self._json(404, {"Code": 10010205001, "Message": "model not found", "Success": False})
            rev = query.get("Revision", ["master"])[0]
            found = repo.lookup(rev) or (repo.lookup("main") if rev == "master" else None)
            if found is None:
                return self._json(404, {"Code": 10010205001, "Message": "revision not found", "Success": False})
            commit, files = found
            if mode == "info":
                return self._json(200, {"Code": 200, "Success": True, "Data": {"Name": repo_id, "Revision": rev}})
            if mode == "files":
                out = [{"Name": p.rsplit("/", 1)[-1], "Path": p, "Type": "blob", "Size": fi.size,
                        "Sha256": fi.sha256, "Revision": commit} for p, fi in sorted(files.items())]
                return self._json(200, {"Code": 200, "Success": True, "Data": {"Files": out}})
            fname = query.get("FilePath", [""])[0]
            fi = files.get(fname)
            if fi is None:
                return self._json(404, {"Code": 10010205001, "Message": "file not found", "Success": False})
            if self._fault_status(fname):
                return
            self._send_file(fi, fname, {}, '"%s"' % fi.sha256)

    return Handler


class HubServer:
    """In-process server for pytest: HubServer(root).start() ... .stop()."""

    def __init__(self, root, token=None, page_size=50):
        self.state = State(root, token, page_size)
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state, False))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state, True))
        self.hub.daemon_threads = self.cdn.daemon_threads = True
        self.hub.block_on_close = self.cdn.block_on_close = False  # a throttled thread may sleep long
        self.state.cdn_port = self.cdn.server_address[1]
        self.threads = []

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.hub.server_address[1]

    def start(self):
        for s in (self.hub, self.cdn):
            t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()
        for t in self.threads:
            t.join(timeout=5)

    def set_fault(self, mode, count=1, path="", retry_after=0):
        with self.state.lock:
            self.state.fault = {"mode": mode, "count": count, "path": path, "retry_after": retry_after}

    def set_rate(self, bytes_per_s, burst=0):
        self.state.rate = bytes_per_s
        self.state.burst = burst

    def stats(self):
        with self.state.lock:
            return {"bytes": dict(self.state.bytes), "gets": dict(self.state.gets),
                    "cdn_auth": list(self.state.cdn_auth), "requests": list(self.state.requests)}

    def reset_stats(self):
        with self.state.lock:
            self.state.bytes, self.state.gets, self.state.cdn_auth, self.state.requests = {}, {}, [], []


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
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--token")
    ap.add_argument("--page-size", type=int, default=50)
    ap.add_argument("--rate", type=int, default=0, help="bytes/s per connection")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    args = ap.parse_args()
    srv = HubServer(args.root, args.token, args.page_size)
    srv.set_rate(args.rate)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv.start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (srv.hub.server_address[1], srv.cdn.server_address[1]))
    os.replace(tmp, args.port_file)
    # Bounded wait: a test server never outlives an hour even if orphaned.
    deadline = time.monotonic() + 3600
    while not stop.is_set() and time.monotonic() < deadline and (not args.parent_pid or _alive(args.parent_pid)):
        stop.wait(0.5)
    srv.stop()


if __name__ == "__main__":
    main()
