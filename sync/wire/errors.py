"""Every exception the sync package raises."""

from __future__ import annotations


class DirectiveError(Exception):
    """A directive is missing, unsigned, forged, for someone else, or older than one the node
    accepted already."""


class TransferError(Exception):
    """The artifact could not be fetched, or what arrived does not match its sha256."""
