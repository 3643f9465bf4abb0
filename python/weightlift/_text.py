"""Text from outside (file names, tensor names, URLs, servers' messages) made
inert before Python puts it in a message or a log line: the C++ engine's own
function (include/weightlift/text.h), so both faces render it one way.

A leaf of the ground floor: imports only _core."""
from __future__ import annotations

from . import _core


def inert(text) -> str:
    """`text` with every control character escaped visibly (ESC as \\x1b, C1 as
    \\u009b, the Unicode controls that reorder text too) and URL secrets
    (userinfo, signatures, tokens in the query) replaced by ***."""
    return _core.inert_text(str(text))

