"""The registry's timestamps: UTC, ISO 8601 to the millisecond, as every table stores them."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
