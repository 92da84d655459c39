"""Strings a peer chose, made safe to show on a terminal.

A node's hello region, its platform fields, an ack's reason or a peer address can carry
``ESC[2J`` (clear the screen), ``ESC]0;...`` (retitle the window), C1 controls (``\\x9b`` is a
CSI on some terminals) or bidi overrides (text that reads differently than it sorts). Every
such character is replaced with a visible escape (``\\x1b``, ``\\u202e``) before the string
reaches a table, a log line or a stored reason; everything else is left as it was.
"""

from __future__ import annotations

import re

BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_HIDDEN = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, limit: int | None = None) -> str:
    """``text`` (cut to ``limit`` characters first) with every control character, DEL, C1
    control and bidi mark replaced with its ``\\xNN`` / ``\\uNNNN`` escape."""
    return _HIDDEN.sub(_escape, text if limit is None else text[:limit])
