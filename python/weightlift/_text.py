"""Text from outside (file names, tensor names, URLs, servers' messages) made
inert before Python puts it in a message or a log line: the C++ engine's own
function (include/weightlift/text.h), so both faces render it one way.

A leaf: the engine's function through the bridge (_engine)."""
from __future__ import annotations

from . import _engine


def inert(text) -> str:
    """`text` with every control character escaped visibly (ESC as \\x1b, C1 as
    \\u009b, the Unicode controls that reorder text too) and URL secrets
    (userinfo, signatures, tokens in the query) replaced by ***."""
    return _engine.inert_text(str(text))


def refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.load's object_pairs_hook for documents that decide which bytes are
    read (a safetensors index): a key repeated in one object is a ValueError,
    as the engine refuses it, instead of the last value winning silently."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {inert(k)!r} in a JSON object")
        out[k] = v
    return out
