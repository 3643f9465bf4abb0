"""The plug-in's options: `--model-loader-extra-config '{"strategy": "stream", ...}'`
(LLM(model_loader_extra_config={...})). Every key is checked; an unknown key
or a bad value is a ValueError naming it, as vLLM's own loaders do."""
from __future__ import annotations

from dataclasses import dataclass, fields

from .. import _engine
from . import _affinity

# vLLM's DefaultModelLoader keys, passed through to it unchanged.
DEFAULT_LOADER_KEYS = ("enable_multithread_load", "num_threads", "enable_weights_track")

_STRATEGIES = _engine.STRATEGIES  # the engine's vocabulary (read_path.h)
_FORMATS = ("auto", "hf", "safetensors", "pt", "npcache", "mistral")
_TRISTATE = ("auto", "on", "off")


@dataclass(frozen=True)
class Options:
    """Documented in docs/vllm.md (defaults here)."""

    # Engine strategy: "auto" reads the tensors that go straight into
    # parameters with `stream` (N threads, O_DIRECT when the files are not
    # cached) and hands the rest to the model as views of the page cache
    # (`lazy`; `stream` for files mostly not cached); any other strategy is
    # used for both.
    strategy: str = "auto"
    # Engine I/O threads (0: the engine's default, 8 local, 16 connections remote).
    threads: int = 0
    # Read size in bytes (0: the engine's default, 8 MiB).
    block_size: int = 0
    # Cap in bytes on the engine's own memory (staging and tensors waiting for
    # the model); 0: the engine's default.
    max_memory: int = 0
    # O_DIRECT: "auto" (when the files are mostly not in the page cache), "on", "off".
    direct_io: str = "auto"
    # Ranks read once: "auto"/"on" use the engine's distributed loading over
    # vLLM's tensor-parallel group when its world size is above 1; "off": every
    # rank reads its own shards and the replicated tensors.
    distributed: str = "auto"
    # Read tensors that land unchanged in a parameter straight into it.
    into_params: bool = True
    # vLLM's file selection, as `--load-format` would pick ("auto": *.safetensors,
    # else *.bin, else *.pt; mistral's consolidated files when present).
    format: str = "auto"
    # CPUs the engine's I/O threads may run on during the load (_affinity.py):
    # "node" every CPU of the NUMA node(s) the worker is bound to (parameter
    # pages stay on its node; vLLM's CPU backend pins a worker to its compute
    # cores, and the rest of the node idles while the model loads), "inherit"
    # the worker's binding, "all" every CPU the cgroup allows.
    cpus: str = "node"
    # Read the checkpoint while vLLM builds the model (_read_ahead.py): local
    # files into the page cache, object storage into staging the load reads.
    read_ahead: bool = True
    # Fault in the parameters' pages while vLLM builds the model (a background
    # thread fed each parameter as it is allocated), so that placement copies
    # into pages already there. Off by default: on the 2-CPU VM of bench/vllm
    # its page faults slow the construction (the address space's lock) more
    # than they save.
    prefault: bool = False
    # A whole host parameter whose checkpoint bytes lie contiguously in a file
    # becomes those bytes: its storage is replaced by a zero-copy view of the
    # file's pages (a private copy-on-write mapping), when the read-ahead has
    # brought the checkpoint into the page cache. No fresh page touched, no
    # byte copied (_loader._map_params_impl). "auto": only where the files lie
    # on a local filesystem (map_params_on); true: wherever; false: never.
    map_params: bool | str = "auto"
    # With the read-ahead running, vLLM's full garbage collection after
    # load_weights runs right after construction instead, while the disk
    # reads (~0.3 s of one core with vLLM imported; _collect.py); vLLM's
    # call after load_weights collects the young generation. false: vLLM's order.
    collect_early: bool = True
    # The objects that exist when load_model starts frozen (gc.freeze()) for
    # its length, so that vLLM's full collections in it walk only what the
    # load created (0.35-0.44 s each with vLLM imported, two per load_model)
    # and put back after (gc.unfreeze()); left alone where the process froze
    # objects itself. Garbage older than load_model waits for the next full
    # collection after it. Off by default (_collect.frozen_heap).
    freeze_gc: bool = False

    @classmethod
    def parse(cls, extra: dict) -> tuple[Options, dict]:
        """(our options, the keys left for DefaultModelLoader)."""
        if not isinstance(extra, dict):
            raise ValueError(f"model_loader_extra_config must be a dict for load format weightlift, "
                             f"got {type(extra).__name__}")
        ours = {f.name for f in fields(cls)}
        unknown = set(extra) - ours - set(DEFAULT_LOADER_KEYS)
        if unknown:
            raise ValueError(f"Unexpected extra config keys for load format weightlift: {sorted(unknown)} "
                             f"(known: {sorted(ours | set(DEFAULT_LOADER_KEYS))})")
        kw = {k: v for k, v in extra.items() if k in ours}
        rest = {k: v for k, v in extra.items() if k not in ours}
        for k in ("threads", "block_size", "max_memory"):
            v = kw.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"weightlift option {k} must be a non-negative integer, got {v!r}")
        for k, allowed in (("strategy", _STRATEGIES), ("format", _FORMATS), ("direct_io", _TRISTATE),
                           ("cpus", _affinity.CHOICES)):
            v = kw.get(k, getattr(cls, k))
            if v not in allowed:
                raise ValueError(f"weightlift option {k} must be one of {list(allowed)}, got {v!r}")
        d = kw.get("distributed", "auto")
        if isinstance(d, bool):
            kw["distributed"] = "on" if d else "off"
        elif d not in _TRISTATE:
            raise ValueError(f"weightlift option distributed must be true, false or 'auto', got {d!r}")
        for k in ("into_params", "read_ahead", "prefault", "collect_early", "freeze_gc"):
            if not isinstance(kw.get(k, True), bool):
                raise ValueError(f"weightlift option {k} must be a bool, got {kw[k]!r}")
        if not isinstance(kw.get("map_params", True), bool) and kw["map_params"] != "auto":
            raise ValueError(f"weightlift option map_params must be true, false or 'auto', got {kw['map_params']!r}")
        return cls(**kw), rest

    def engine(self, **extra) -> dict:
        """Engine options (weightlift._engine.options keywords) for one load."""
        o = dict(threads=self.threads or None, block_size=self.block_size or None,
                 max_memory=self.max_memory or None, direct=self.direct_io)
        o.update(extra)
        return {k: v for k, v in o.items() if v is not None}


# Filesystems whose pages a parameter may stay mapped onto while vLLM serves
# (map_params "auto"): local ones, on a block device of this machine or in
# its memory. A clean page of theirs the kernel reclaims under memory
# pressure is read again from the local disk on the next access (a stall,
# never a failure). Not: network and cluster filesystems (nfs, cifs, lustre,
# gpfs, ceph, ...), FUSE (s3fs, gcsfuse, sshfs, ...), a host's share into a
# VM (9p, virtiofs): there a page re-read during serving waits on a server,
# and an outage hangs the access or kills the process (SIGBUS); nor a type
# the mount table does not tell.
LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "jfs", "reiserfs", "nilfs2",
    "tmpfs", "ramfs", "overlay", "squashfs", "erofs",
})


def map_params_on(option: bool | str, fs_types: dict[str, str]) -> tuple[bool, str]:
    """Whether parameters may be mapped onto the checkpoint's pages, and why:
    `option` (map_params: True, False or "auto") and the filesystem type
    serving each file ({path: type, "" when unknown}). "auto" maps only when
    every file lies on a LOCAL_FILESYSTEMS type."""
    if option is True:
        return True, "map_params: true"
    if option is False:
        return False, "map_params: false"
    others = sorted({t or "an unknown filesystem" for t in fs_types.values() if t not in LOCAL_FILESYSTEMS})
    if others:
        return False, (f"map_params auto: the checkpoint is on {', '.join(others)}, not a local filesystem (a page "
                       f"re-read while serving would wait on its server); parameters are copied")
    return True, f"map_params auto: the checkpoint is on {', '.join(sorted(set(fs_types.values())))}"
