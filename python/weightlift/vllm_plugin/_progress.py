"""vLLM's habits: one progress bar over the checkpoint's files on rank 0
(vLLM's own bar format, a line per finished file), and log lines carrying
what vLLM's loaders log (filesystem, checkpoint size, available RAM; the
engine's own reasons for each load it ran, from its plan; then bytes and
seconds each way)."""
from __future__ import annotations

import logging
import os
from collections import Counter

import torch

from .. import _engine
from .._text import inert

logger = logging.getLogger("weightlift.vllm")

# vLLM's weight_utils._BAR_FORMAT: plain text, one line per update.
BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"
BAR_DESC = "Loading safetensors checkpoint shards"


def _rank0() -> bool:
    d = torch.distributed
    return not (d.is_available() and d.is_initialized()) or d.get_rank() == 0


class FileBar:
    """A bar over files advanced as each file's last tensor is handed to the
    model (vLLM's iterators advance it file by file the same way)."""

    def __init__(self, files: list[str], file_of: dict[str, str], use_tqdm_on_load: bool):
        self._left = Counter(file_of.values())
        self._file_of = file_of
        self._total = len(files)
        self._done = 0
        self._bar = None
        if use_tqdm_on_load and _rank0() and files:
            from tqdm.auto import tqdm

            desc = BAR_DESC if all(f.endswith(".safetensors") for f in files) else "Loading pt checkpoint shards"
            self._bar = tqdm(total=self._total, desc=desc, bar_format=BAR_FORMAT)
        # Files with no tensor this rank loads count as done at once.
        self._advance(self._total - len(self._left))

    def _advance(self, n: int) -> None:
        if n > 0:
            self._done += n
            if self._bar is not None:
                self._bar.update(n)

    def done_tensors(self, names) -> None:
        finished = 0
        for n in names:
            f = self._file_of.get(n)
            if f is None:
                continue
            self._left[f] -= 1
            if self._left[f] == 0:
                finished += 1
        self._advance(finished)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def rss_bytes() -> dict:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), in bytes."""
    out = {}
    try:
        for line in open("/proc/self/status"):
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def _gib(n: int) -> float:
    return n / 1024**3


def log_start(files: list[str], total_bytes: int, tp_size: int, distributed: bool, opts) -> None:
    first = files[0] if files else ""
    if "://" in first:
        fs = first.split("://", 1)[0]
    else:
        fs = _engine.filesystem_type(first) if first else ""
    avail = _engine.available_ram_bytes()
    logger.info("weightlift: %d checkpoint files (%.2f GiB) on %s, available RAM %.2f GiB; strategy %s, "
                "direct I/O %s, into parameters %s%s", len(files), _gib(total_bytes), (fs or "unknown").upper(),
                _gib(avail), opts.strategy, opts.direct_io, "on" if opts.into_params else "off",
                f", tensor parallel {tp_size} ({'read once across ranks' if distributed else 'each rank its shards'})"
                if tp_size > 1 else "")


def log_plan(result: dict) -> None:
    """What the engine decided for a load it ran, in its own words: the lines
    its plan logged (the strategy and why, the readers' setup; then what the
    load said as it ran), from the figures load_into() or a stream returned."""
    warnings = set(result.get("warnings") or ())
    for line in result.get("log") or ():
        (logger.warning if line in warnings else logger.info)("weightlift: %s", line)


def log_done(stats: dict, placements: int, loose: list, mat) -> None:
    secs = stats["seconds"]
    if stats.get("mapped_tensors"):
        logger.info("weightlift: of the tensors straight into parameters, %.2f GiB (%d tensors) mapped from the "
                    "page cache in %.2f s (no copy)", _gib(stats["mapped_bytes"]), stats["mapped_tensors"],
                    stats["mapped_seconds"])
    logger.info(
        "weightlift: %.2f GiB in %.2f s: %.2f GiB (%d tensors) read straight into parameters in %.2f s, "
        "%.2f GiB (%d tensors) through the model's load_weights; storage read %.2f GiB%s%s",
        _gib(stats["direct_bytes"] + stats["model_bytes"]), secs, _gib(stats["direct_bytes"]),
        stats["direct_tensors"], stats["direct_seconds"], _gib(stats["model_bytes"]), stats["model_tensors"],
        _gib(stats["bytes_read"]),
        f", exchanged {_gib(stats['bytes_exchanged']):.2f} GiB" if stats.get("bytes_exchanged") else "",
        ", O_DIRECT" if stats.get("direct_io") else "")
    if mat.count:
        logger.warning("weightlift: %d tensor(s) (%.2f GiB) were read a second time because the model did not "
                       "copy them unchanged (%s%s)", mat.count, _gib(mat.bytes), inert(", ".join(mat.names)),
                       ", ..." if mat.count > len(mat.names) else "")
    if loose:
        logger.warning("weightlift: the model never took %d tensor(s) that were read into its parameters: %s",
                       len(loose), inert(", ".join(p.name for p in loose[:5])))


def dump_stats(stats: dict, kind: str = "load") -> None:
    """With $WEIGHTLIFT_VLLM_STATS_DIR set (tests, bench/vllm): this rank's
    figures there, as rank<R>-<pid>.json for a model's first load_weights
    (kind "load"), stream-rank<R>-<pid>-<n>.json for the n-th plain stream
    (kind "stream": reload_weights, EPLB, any other caller)."""
    folder = os.environ.get("WEIGHTLIFT_VLLM_STATS_DIR")
    if not folder:
        return
    import json

    global _streams
    os.makedirs(folder, exist_ok=True)
    stem = f"rank{stats.get('tp_rank', 0)}-{os.getpid()}"
    if kind == "stream":
        _streams += 1
        stem = f"stream-{stem}-{_streams}"
    path = os.path.join(folder, stem + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(stats, f)
    os.replace(path + ".tmp", path)


_streams = 0


class _ToVllmLog(logging.Handler):
    """Hands weightlift's records to the `vllm` logger's handlers as they are
    at that moment (vLLM may reconfigure its logging after the plug-in ran),
    at vLLM's level."""

    def emit(self, record: logging.LogRecord) -> None:
        vl = logging.getLogger("vllm")
        if record.levelno >= vl.getEffectiveLevel():
            vl.handle(record)


def route_to_vllm_log() -> None:
    """weightlift's log lines go through vLLM's log handlers (its format, its
    level, its process prefixes), not Python's root logger. Idempotent; left
    alone with VLLM_CONFIGURE_LOGGING=0 (the application owns logging then)."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    wl = logging.getLogger("weightlift")
    if any(isinstance(h, _ToVllmLog) for h in wl.handlers):
        return
    wl.addHandler(_ToVllmLog())
    wl.setLevel(logging.DEBUG)  # vLLM's level decides, in the handler
    wl.propagate = False
