"""http(s):// URLs as sources: ranged GETs against a server that honours Range,
and one that ignores it (answers 200 with the whole file): same bytes."""
from __future__ import annotations

import functools
import http.server
import os
import re
import threading

import pytest

from .s3cli import checksums, sh


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with single Range requests (206), as object stores do."""

    def log_message(self, *args):
        pass

    def send_head(self):
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        a, b = int(m.group(1)), min(int(m.group(2)), size - 1)
        f = open(path, "rb")
        f.seek(a)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {a}-{b}/{size}")
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        self.remaining = b - a + 1
        return f

    def copyfile(self, source, outputfile):
        n = getattr(self, "remaining", None)
        if n is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(n))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module", params=["ranges", "no-ranges"])
def http_root(request, model):
    handler = RangeHandler if request.param == "ranges" else QuietHandler
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(model)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("strategy", ["stream", "lazy"])
def test_http_urls_load_like_local_files(http_root, model, strategy):
    shards = sorted(p.name for p in model.glob("*.safetensors"))
    urls = [f"{http_root}/{s}" for s in shards]
    local = [str(model / s) for s in shards]
    extra = ["--strategy", strategy, "--block-size", "256KiB", "--threads", "3"]
    assert checksums(urls[0], *extra) + checksums(urls[1], *extra) == checksums(local[0]) + checksums(local[1])


def test_http_missing_file(http_root):
    r = sh("load", f"{http_root}/nope.safetensors", check=False)
    assert r.returncode == 1
    assert f"{http_root}/nope.safetensors: no such object" in r.stderr or "not found (HTTP 404)" in r.stderr, r.stderr
