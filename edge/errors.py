"""Every exception the edge package raises."""

from __future__ import annotations


class CenterUnavailable(Exception):
    """No center answered in time; the reason for each center tried is in the message."""
