"""Answers of the service and entries of the disk cache, read as untrusted input.

Whatever the server or a cache file says is parsed and checked field by field
before the client uses it: a document of at most :data:`MAX_DOCUMENT_BYTES`, a JSON
object, every field the client reads of the right type and range, and a config
that is usable for the workload (:meth:`kernel.config.TileConfig.check_usable`).
Every way of failing is one exception, :class:`AnswerFormatError`, naming the field
and the rule, so a caller has exactly one thing to treat as a miss. Messages
show untrusted values through :mod:`reprlib` only: the repr of a deeply nested
value would itself raise ``RecursionError``.

Fields the client does not read (``timing``, ``versions``, ``distance``, ...) are
not checked, so a newer server may add fields.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from typing import Any

from kernel.config import TileConfig
from kernel.workload import Workload

SERVER_SOURCES = ("tuned", "stale", "nearest", "heuristic")
TUNED_SOURCES = ("tuned", "stale")  # a tuned config of this very workload
CACHE_FORMAT = 1
# Far above a real answer or entry (under 1 KB), far below what could hurt a model's host.
MAX_DOCUMENT_BYTES = 64 * 1024
MAX_ID = 2**63 - 1  # the widest SQL integer: above it is no id or snapshot the service gave
CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(TileConfig))
MESSAGE_CHARS = 300  # of a server's rejection message, kept for logs and errors

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


class AnswerFormatError(ValueError):
    """An answer or cache entry that breaks its format; the message names the field and the rule."""


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


@dataclasses.dataclass(frozen=True)
class CachedAnswer:
    """A disk entry: its answer and ``expires_at`` (``time.time()`` seconds; always finite)."""

    answer: Answer
    expires_at: float


def parse_document(raw: bytes, what: str) -> dict[str, Any]:
    """The JSON object in ``raw``, or :class:`AnswerFormatError` naming ``what`` broke which rule."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise AnswerFormatError(f"{what}: {len(raw)} bytes, more than {MAX_DOCUMENT_BYTES}")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise AnswerFormatError(f"{what}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise AnswerFormatError(f"{what}: not JSON ({shorten(str(exc))})") from None
    if not isinstance(data, dict):
        raise AnswerFormatError(f"{what}: must be a JSON object, got {type(data).__name__}")
    return data


def server_answer(data: dict[str, Any], workload: Workload, pinned: int | None) -> Answer:
    """The answer of ``POST /v1/lookup`` for ``workload``, asked at snapshot ``pinned`` (None: unpinned).

    ``workload_key`` must be the workload's; ``source`` one of :data:`SERVER_SOURCES`;
    ``config`` a usable config (:func:`usable_config`); ``snapshot`` an integer >= 0,
    the pinned one when pinned; ``config_id`` and ``job_id`` absent or integers >= 1,
    ``config_id`` <= ``snapshot`` (the snapshot is the highest tuned-config id).
    """
    _same_workload(data, workload)
    source = _choice(data, "source", SERVER_SOURCES)
    config = usable_config(data.get("config"), workload)
    snapshot = _snapshot(data, pinned)
    config_id = _integer(data, "config_id", 1)
    if config_id is not None and config_id > snapshot:
        raise AnswerFormatError(f"config_id: {config_id} must be <= snapshot ({snapshot})")
    job_id = _integer(data, "job_id", 1)
    return Answer(config, source, "server", workload.key, config_id, snapshot, job_id)


def cache_entry(answer: Answer, expires_at: float, fetched_at: float) -> dict[str, Any]:
    """The disk form of a server's answer (read back by :func:`cached_answer`)."""
    return {
        "format": CACHE_FORMAT,
        "workload_key": answer.workload_key,
        "source": answer.source,
        "config": answer.config.to_dict(),
        "config_id": answer.config_id,
        "snapshot": answer.snapshot,
        "fetched_at": fetched_at,
        "expires_at": expires_at,
    }


def cached_answer(data: dict[str, Any], workload: Workload, pinned: int | None) -> CachedAnswer:
    """A disk entry for ``workload`` (see :func:`cache_entry`), checked as a server answer is.

    ``expires_at`` must be a finite number. ``null``, which clients before expiry was
    mandatory wrote for pinned answers, reads as expired at the epoch: such an entry is
    used only when the server cannot be asked, and replaced by the next answer.
    """
    if _required_integer(data, "format", 1) != CACHE_FORMAT:
        raise AnswerFormatError(f"format: must be {CACHE_FORMAT}, got {_short.repr(data.get('format'))}")
    _same_workload(data, workload)
    source = _choice(data, "source", SERVER_SOURCES)
    config = usable_config(data.get("config"), workload)
    snapshot = _snapshot(data, pinned)
    config_id = _integer(data, "config_id", 1)
    if "expires_at" not in data:
        raise AnswerFormatError("expires_at: required")
    expires_at = data["expires_at"]
    if expires_at is None:
        expires_at = 0.0
    elif isinstance(expires_at, bool) or not isinstance(expires_at, int | float) or not math.isfinite(expires_at):
        raise AnswerFormatError(f"expires_at: must be a finite number, got {_short.repr(expires_at)}")
    answer = Answer(config, source, "disk", workload.key, config_id, snapshot)
    return CachedAnswer(answer, float(expires_at))


def usable_config(value: Any, workload: Workload) -> TileConfig:
    """The TileConfig of ``value``: an object with every TileConfig field, each a string or an
    integer, that builds a TileConfig usable for the workload's sequence, backend and dtype."""
    if not isinstance(value, dict):
        raise AnswerFormatError(f"config: must be an object, got {type(value).__name__}")
    if set(value) != CONFIG_FIELDS:
        missing, unknown = sorted(CONFIG_FIELDS - set(value)), sorted(set(value) - CONFIG_FIELDS)
        raise AnswerFormatError(
            f"config: must have exactly the TileConfig fields (missing {missing}, unknown {_short.repr(unknown)})"
        )
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise AnswerFormatError(f"config.{name}: must be a string or an integer, got {type(item).__name__}")
    try:
        config = TileConfig.from_dict(value)
        config.check_usable(workload.pattern.seq_len, workload.backend, workload.dtype)
    except ValueError as exc:
        raise AnswerFormatError(f"config: {shorten(str(exc))}") from None
    return config


def rejection_message(body: bytes) -> str:
    """What a 4xx answer says: its ``message`` (or ``detail``), else the start of its text."""
    try:
        data = parse_document(body, "answer")
    except AnswerFormatError:
        return shorten(body[:MESSAGE_CHARS].decode("utf-8", "replace"))
    message = data.get("message") or data.get("detail")
    return shorten(message if isinstance(message, str) else _short.repr(message))


def shorten(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def _same_workload(data: dict[str, Any], workload: Workload) -> None:
    got = data.get("workload_key")
    if got != workload.key:
        raise AnswerFormatError(f"workload_key: must be {workload.key}, got {_short.repr(got)}")


def _choice(data: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = data.get(name)
    if not isinstance(value, str) or value not in allowed:
        raise AnswerFormatError(f"{name}: must be one of {allowed}, got {_short.repr(value)}")
    return value


def _snapshot(data: dict[str, Any], pinned: int | None) -> int:
    snapshot = _required_integer(data, "snapshot", 0)
    if pinned is not None and snapshot != pinned:
        raise AnswerFormatError(f"snapshot: must be the pinned snapshot {pinned}, got {snapshot}")
    return snapshot


def _required_integer(data: dict[str, Any], name: str, minimum: int) -> int:
    value = _integer(data, name, minimum)
    if value is None:
        raise AnswerFormatError(f"{name}: required")
    return value


def _integer(data: dict[str, Any], name: str, minimum: int) -> int | None:
    """``data[name]``: an integer in [minimum, MAX_ID], or None when absent or null."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AnswerFormatError(f"{name}: must be an integer, got {type(value).__name__}")
    if not minimum <= value <= MAX_ID:
        raise AnswerFormatError(f"{name}: must be in [{minimum}, {MAX_ID}], got {value}")
    return value
