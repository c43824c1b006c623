"""Answers, and the on-disk cache of answers shared by the processes of a machine."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from kernel.config import TileConfig

log = logging.getLogger("tiletune.client")

SERVER_SOURCES = ("tuned", "stale", "nearest", "heuristic")
TUNED_SOURCES = ("tuned", "stale")  # a tuned config of this very workload
CACHE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Answer:
    """A resolved config and where it came from.

    ``source`` is the server's (``tuned`` | ``stale`` | ``nearest`` | ``heuristic``) or
    ``fallback`` (the kernel's heuristic computed here, the server not asked or not
    reachable); ``origin`` is where this process got it: ``server``, ``disk``,
    ``disk-expired`` (an expired entry used because the server could not be asked) or
    ``local``.
    """

    config: TileConfig
    source: str
    origin: str
    workload_key: str
    config_id: int | None = None
    snapshot: int | None = None
    job_id: int | None = None
    detail: str | None = None  # why a fallback was used

    @property
    def tuned(self) -> bool:
        return self.source in TUNED_SOURCES


class DiskCache:
    """One JSON file per entry in ``directory``; safe to share between processes.

    Writes go to a temporary file in the same directory and are moved into place
    with ``os.replace`` (atomic on POSIX), so a reader sees a whole file or none;
    two processes writing one entry leave one of their (equal) answers. Anything
    unreadable is treated as absent. No fsync: after a power loss an entry may be
    empty, which reads as absent.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._ready = False
        self._broken = False

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str, workload_key: str) -> tuple[Answer, float | None] | None:
        """(answer, expires_at or None for never) of an entry, or None when absent or unreadable."""
        try:
            data = json.loads(self.path(key).read_bytes())
            if data.get("format") != CACHE_FORMAT or data.get("workload_key") != workload_key:
                return None
            source = data["source"]
            expires = data["expires_at"]
            if source not in SERVER_SOURCES or not (expires is None or isinstance(expires, int | float)):
                return None
            answer = Answer(
                TileConfig.from_dict(data["config"]),
                source,
                "disk",
                workload_key,
                opt_int(data.get("config_id")),
                opt_int(data.get("snapshot")),
            )
            return answer, expires
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("ignoring unreadable cache entry %s: %s", self.path(key), exc)
            return None

    def put(self, key: str, answer: Answer, expires_at: float | None) -> bool:
        if self._broken:
            return False
        entry = {
            "format": CACHE_FORMAT,
            "workload_key": answer.workload_key,
            "source": answer.source,
            "config": answer.config.to_dict(),
            "config_id": answer.config_id,
            "snapshot": answer.snapshot,
            "fetched_at": time.time(),
            "expires_at": expires_at,
        }
        tmp = None
        try:
            if not self._ready:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._ready = True
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as fh:
                json.dump(entry, fh, separators=(",", ":"))
            os.replace(tmp, self.path(key))
            return True
        except OSError as exc:
            self._broken = True
            log.warning("tiletune: config cache %s is not writable (%s); caching in memory only", self.directory, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False


def opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value
