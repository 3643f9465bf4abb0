"""`weightlift ls REPO`: a Hub repository id is downloaded (or found offline) and listed."""
import json
import subprocess

from conftest import CLI
from hub_fixtures import HubServer, write_repo


def test_ls_resolves_a_repository_id(tmp_path):
    subprocess.run([CLI, "synth", str(tmp_path / "m"), "--size", "TINY"], check=True, capture_output=True)
    files = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    write_repo(tmp_path / "repos", "org/llama", "main", files)
    server = HubServer(str(tmp_path / "repos")).start()
    try:
        env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
        local = subprocess.run([CLI, "ls", str(tmp_path / "m"), "--format", "jsonl"], capture_output=True, text=True,
                               check=True).stdout
        remote = subprocess.run([CLI, "ls", "org/llama", "--format", "jsonl"], capture_output=True, text=True,
                                env=env)
        assert remote.returncode == 0, remote.stderr
    finally:
        server.stop()
    # Offline, from the cache the first call filled.
    offline = subprocess.run([CLI, "ls", "org/llama", "--offline", "--format", "jsonl"], capture_output=True,
                             text=True, env=env)
    assert offline.returncode == 0, offline.stderr

    def strip(out):
        return [{k: v for k, v in json.loads(line).items() if k != "file"} for line in out.splitlines()]

    assert strip(remote.stdout) == strip(local) == strip(offline.stdout)
    assert "models--org--llama/snapshots/" in json.loads(remote.stdout.splitlines()[0])["file"]


def test_load_resolves_a_repository_id(tmp_path):
    subprocess.run([CLI, "synth", str(tmp_path / "m"), "--size", "TINY"], check=True, capture_output=True)
    write_repo(tmp_path / "repos", "org/llama", "main", {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()})
    server = HubServer(str(tmp_path / "repos")).start()
    try:
        env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
        remote = subprocess.run([CLI, "load", "org/llama", "--checksum", "--format", "jsonl", "--no-progress"],
                                capture_output=True, text=True, env=env)
        assert remote.returncode == 0, remote.stderr
    finally:
        server.stop()
    local = subprocess.run([CLI, "load", str(tmp_path / "m"), "--checksum", "--format", "jsonl", "--no-progress"],
                           capture_output=True, text=True, check=True)
    assert remote.stdout == local.stdout
