"""Running the CLI against the object-storage servers, and what the tests share."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CLI = os.environ.get("WEIGHTLIFT_CLI", os.path.join(ROOT, "build", "bin", "weightlift"))
BUCKET = "models"
# Besides the model: files a bucket holds that a load must not pick up.
UNRELATED = {
    "README.md": b"# models bucket\n",
    "llama-v2/model.safetensors": b"not a model under the llama/ prefix",
    "llama/notes/changelog.txt": b"a subfolder of the model prefix\n",
    "llama/training_args.bin": b"training-only file",
}


def sh(*args, env=None, check=True, timeout=300):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("AWS_", "GS_", "RUNAI_STREAMER_", "GOOGLE_", "CLOUDSDK_", "WEIGHTLIFT_GS_"))}
    e.update(env or {})
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"weightlift {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


def checksums(path, *extra, env=None):
    """[(name, dtype, shape, sha256)] of every tensor, in checkpoint order."""
    r = sh("load", path, "--checksum", "--format", "jsonl", "--no-progress", *extra, env=env)
    return [tuple(json.dumps(v) if isinstance(v, list) else v for v in json.loads(line).values())
            for line in r.stdout.splitlines()]


def upload(client, bucket, items: dict[str, bytes]):
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), items.items()))


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()
