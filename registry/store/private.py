"""A registry home is private: its folders 0700, its files 0600, whatever the umask of the
command that first made it. It holds the database (every release, token generation and audit
record) and the blobs (the centers' artifacts); a local user has no business reading either.

The modes are set explicitly (``mode=`` and ``chmod``, which the umask does not touch) where the
home, the database and the blob and chunk folders are made; ``PRIVATE_UMASK`` is what the
``registry`` command runs under, so whatever else it writes into a home (keys, certificates,
copies from a primary, backups) is private too."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)
FOLDER, FILE = 0o700, 0o600
PRIVATE_UMASK = 0o077
DATABASE_SUFFIXES = ("", "-wal", "-shm", "-journal")  # SQLite's files beside the database


def folders(path: Path) -> Path:
    """``path`` and any missing parents made, each one made here 0700 (``mkdir -p``)."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=FOLDER)
        except FileExistsError:  # made meanwhile by another process: its mode is its own
            continue
        os.chmod(folder, FOLDER)  # mkdir's mode is masked by the umask; chmod's is not
    return path


def database(path: Path) -> None:
    """The database file made 0600 before SQLite opens it (SQLite gives its WAL and
    shared-memory files the database's mode), and an existing one's files tightened to 0600."""
    folders(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE)
    except FileExistsError:
        for suffix in DATABASE_SUFFIXES:
            tighten(path.with_name(path.name + suffix), FILE)
        return
    try:
        os.fchmod(fd, FILE)
    finally:
        os.close(fd)


def tighten(path: Path, mode: int) -> None:
    """``path`` to ``mode`` if it gives group or others any access (a home made before homes
    were private); left as it is where this user may not change it."""
    try:
        current = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if current & 0o077:
        try:
            os.chmod(path, mode)
        except PermissionError:
            log.warning("%s is readable by others (mode %o) and not this user's to change",
                        path, current)
