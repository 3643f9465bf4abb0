"""The package's logger ("weightlift") and its say-it-once helper.

A leaf: imports nothing of the package."""
from __future__ import annotations

import logging

logger = logging.getLogger("weightlift")

_said: set[str] = set()


def log_once(level: int, msg: str, *args) -> None:
    """Logs `msg % args` at `level` the first time this process sees that text."""
    key = msg % args if args else msg
    if key not in _said:
        _said.add(key)
        logger.log(level, msg, *args)
