"""The on-disk cache of answers, shared by the processes of a machine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path

from autotune.client.answer import (
    MAX_DOCUMENT_BYTES,
    Answer,
    AnswerFormatError,
    CachedAnswer,
    cache_entry,
    cached_answer,
    parse_document,
)
from kernel.workload import Workload

log = logging.getLogger("tiletune.client")


class DiskCache:
    """One JSON file per entry in ``directory``; safe to share between processes.

    Writes go to a temporary file in the same directory and are moved into place
    with ``os.replace`` (atomic on POSIX), so a reader sees a whole file or none;
    two processes writing one entry leave one of their (equal) answers. Anything
    unreadable is treated as absent: a missing, unreadable or malformed file, and
    anything but a regular file (a FIFO, a device, a directory), which is never read
    and is replaced by the next answer. No fsync: after a power loss an entry may be
    empty, which reads as absent.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ready = False
        self._broken = False

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str, workload: Workload, pinned: int | None) -> CachedAnswer | None:
        """The entry ``key`` for ``workload`` (see :func:`autotune.client.answer.cached_answer`), or
        None when absent, unreadable or malformed."""
        path = self.path(key)
        raw = _read_regular_file(path, MAX_DOCUMENT_BYTES)
        if raw is None:
            return None
        try:
            return cached_answer(parse_document(raw, "cache entry"), workload, pinned)
        except AnswerFormatError as exc:
            log.debug("ignoring cache entry %s: %s", path, exc)
            return None

    def put(self, key: str, answer: Answer, expires_at: float) -> bool:
        """Write an entry; False when it could not be written. A directory that cannot hold files
        turns the disk cache off for this process (warned once)."""
        if self._broken:
            return False
        entry = cache_entry(answer, expires_at, time.time())
        try:
            if not self._ready:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._ready = True
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        except OSError as exc:
            self._broken = True
            log.warning("tiletune: config cache %s is not writable (%s); caching in memory only", self.directory, exc)
            return False
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(entry, fh, separators=(",", ":"))
            os.replace(tmp, self.path(key))  # also over a FIFO or device left at the path
            return True
        except OSError as exc:  # this entry only (a directory at its path, a full disk)
            log.debug("tiletune: could not write cache entry %s: %s", self.path(key), exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False


def _read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes, else None.

    Opened non-blocking: opening a FIFO for reading otherwise waits for a writer, and
    reading it waits for data, forever. Only then is the file type checked (fstat of
    the opened file, so a swap between the check and the read changes nothing).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.debug("ignoring unreadable cache entry %s: %s", path, exc)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            log.debug("ignoring cache entry %s: not a regular file", path)
            return None
        if info.st_size > limit:
            log.debug("ignoring cache entry %s: %d bytes, more than %d", path, info.st_size, limit)
            return None
        data = b""
        while len(data) <= limit:  # a file growing while it is read stops at limit + 1 bytes
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                return data
            data += chunk
        return None
    except OSError as exc:
        log.debug("ignoring unreadable cache entry %s: %s", path, exc)
        return None
    finally:
        os.close(fd)
