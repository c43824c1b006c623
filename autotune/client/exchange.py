"""One HTTP request of the client, bounded by a wall-clock deadline.

httpx's timeouts bound each socket operation, not a request: a server that sends
its answer (or its headers) one byte at a time, never pausing long enough for a
read timeout, holds ``httpx.Client.request`` as long as it likes, and neither
bounds a DNS lookup. So :func:`exchange` runs the request in a daemon thread and
the caller waits for it only until the deadline, then abandons it: whatever the
network does, the caller gets a :class:`Reply` or :class:`ExchangeError` by the
deadline (plus a thread wake-up).

The abandoned thread ends on its own soon after: each socket operation is bounded
by the time that was left when the request began, the body is read in chunks with
the deadline checked between them, and at most ``max_bytes`` of it are read
(``accept-encoding: identity``, so no compressed body can expand past that). One
case is left to the server: headers that keep trickling in hold the thread (not
the caller) until the server stops or httpcore's 100 KB limit on them is reached,
because httpx checks nothing between the reads of a response's head.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import httpx


@dataclasses.dataclass(frozen=True)
class Reply:
    """A whole answer: its status and body."""

    status: int
    body: bytes


class ExchangeError(Exception):
    """No whole answer before the deadline: a network error, a timeout, a body too large."""


def exchange(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    deadline: float,
    max_bytes: int,
    json: Any = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """``method path`` on ``http``, answered in whole before ``deadline`` (``time.monotonic()``).

    Raises :class:`ExchangeError` for anything that is not a whole answer in time;
    never anything else.
    """
    outcome: list[Reply | Exception] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(_send(http, method, path, deadline, max_bytes, json, headers))
        except Exception as exc:  # handed to the caller, who may have stopped waiting
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="tiletune-request", daemon=True).start()
    if not done.wait(max(deadline - time.monotonic(), 0.0)):
        raise ExchangeError("no whole answer by the deadline")
    (result,) = outcome
    if isinstance(result, Reply):
        return result
    if isinstance(result, ExchangeError):
        raise result
    raise ExchangeError(f"{type(result).__name__}: {result}") from None


def _send(
    http: httpx.Client,
    method: str,
    path: str,
    deadline: float,
    max_bytes: int,
    body: Any,
    headers: dict[str, str] | None,
) -> Reply:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ExchangeError("no time left before the deadline")
    headers = {**(headers or {}), "accept-encoding": "identity"}
    with http.stream(method, path, json=body, headers=headers, timeout=left) as response:
        encoding = response.headers.get("content-encoding", "identity")
        if encoding.strip().lower() != "identity":
            raise ExchangeError(f"content-encoding {encoding[:40]!r}, asked for identity")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ExchangeError(f"a body of {declared[:20]} bytes, more than {max_bytes}")
        data = bytearray()
        for chunk in response.iter_bytes():  # identity encoding: the bytes as they arrive
            data += chunk
            if len(data) > max_bytes:
                raise ExchangeError(f"a body of more than {max_bytes} bytes")
            if time.monotonic() >= deadline:
                raise ExchangeError("the body was still arriving at the deadline")
        return Reply(response.status_code, bytes(data))
