"""A database outage, and riding it out.

A PostgreSQL restart, a failover, an administrator or a proxy cutting idle
connections: every connection a process holds breaks, and for a while new ones
may be refused. None of that is a fault of the statement that hit it, and a
worker must not die of it (a fleet of TPU workers would all die of one database
restart). :func:`is_outage` tells such an error from a real one;
:func:`ride_out` retries one unit of database work through an outage, as long as
its :class:`Patience` says;
:class:`OutageWait` paces a loop that waits for the database to come back.

What counts as an outage (the error or one it was raised from, so Optuna's
``StorageInternalError`` raised from a SQLAlchemy error counts too; an error merely
raised while another was handled does not, but for SQLAlchemy's ``PendingRollbackError``
raised while an outage was handled: the session was used again on the broken connection):

- a connection SQLAlchemy found broken (``connection_invalidated``);
- a connection that could not be made (an ``OperationalError`` with no statement);
- on PostgreSQL, SQLSTATE class 08 (connection exception), 57P (the server
  shutting down or starting up), 53300 (too many connections), and 40001 / 40P01
  (a serialization failure or a deadlock: the transaction was rolled back whole);
- on SQLite, a database locked or busy past the busy timeout.

A retry after an outage is safe for tiletune's own units of work: a failed
transaction is rolled back whole, and the few whose commit may have landed
before the connection broke find their own earlier result when tried again
(:func:`server.store.queue.complete_trial`, :func:`server.store.compiles.record_compile`,
:func:`server.worker.worker.publish_job_winner`; a worker's coordinator takes a ``busy``
reservation of its own row as its own, and its Optuna storage a ``tell`` already told).
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity
from sqlalchemy import exc as sa_exc

log = logging.getLogger("tiletune.store")

T = TypeVar("T")

#: PostgreSQL SQLSTATEs (prefixes) of errors that pass: the connection, the server's state, a rolled-back transaction.
TRANSIENT_SQLSTATES = ("08", "57P", "53300", "40001", "40P01")

#: :func:`ride_out` logs an outage's first retry and every this many after it (a minute at 5 s a wait).
LOG_EVERY = 12


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error that caused it) is the database being away, not the statement being wrong."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and _dbapi_outage(current):
            return True
        if isinstance(current, sa_exc.PendingRollbackError) and current.__context__ is not None:
            # The same session used again after its connection broke (Optuna's storage does so in
            # its own error handling): SQLAlchemy's word for the outage met a moment before.
            return is_outage(current.__context__)
        current = current.__cause__
    return False


def _dbapi_outage(error: sa_exc.DBAPIError) -> bool:
    orig = error.orig
    if isinstance(orig, sqlite3.Error):  # a file: no connection to lose, only a writer to wait for
        return isinstance(orig, sqlite3.OperationalError) and ("locked" in str(orig) or "busy" in str(orig))
    if error.connection_invalidated:
        return True
    if not isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError):
        return False
    sqlstate = getattr(orig, "sqlstate", None)
    if error.statement is None or sqlstate is None:
        # Raised while connecting, or by a server that never answered (a reset or closed socket).
        return True
    return str(sqlstate).startswith(TRANSIENT_SQLSTATES)


@dataclasses.dataclass(frozen=True)
class Patience:
    """How long a unit of database work waits out an outage (:func:`ride_out`).

    ``seconds`` alone: that long. With ``until``: without end while that event is unset
    (a worker waits for its database as long as it runs, so a failover that outlasts
    its lease costs it nothing), then for what is left of ``seconds`` since the first
    try (a process asked to stop in a long outage gives up at once; one asked to stop
    before a short outage still rides it out).
    """

    seconds: float
    until: threading.Event | None = None


def ride_out(call: Callable[[], T], *, what: str, patience: Patience | float) -> T:
    """``call()``, tried again while it fails with an outage, as long as ``patience`` says
    (a number: that many seconds).

    Waits grow from a quarter of a second to 5 s, plus up to a quarter of a second at
    random (so the workers of a fleet do not all come back at once). An error that is
    not an outage, or an outage that outlasts the patience, is raised as it came. The
    outage is logged as it begins, then every :data:`LOG_EVERY` tries, and when it ends.
    """
    if not isinstance(patience, Patience):
        patience = Patience(patience)
    stop = patience.until
    stops: tenacity.stop.stop_base = tenacity.stop_after_delay(patience.seconds)
    if stop is not None:
        stops = stops & tenacity.stop_when_event_set(stop)
    began: list[float] = []

    def sleep(seconds: float) -> None:
        if stop is None:
            time.sleep(seconds)
        else:
            stop.wait(seconds)

    def warn(state: tenacity.RetryCallState) -> None:
        if not began:
            began.append(state.start_time)  # the first try's start (time.monotonic)
        if state.attempt_number == 1 or state.attempt_number % LOG_EVERY == 0:
            error = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning(
                "%s: database unavailable for %.0f s (%s), trying again in %.1f s",
                what,
                time.monotonic() - began[0],
                describe(error),
                wait,
            )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_outage),
        wait=tenacity.wait_exponential(multiplier=0.25, max=5.0) + tenacity.wait_random(0, 0.25),
        stop=stops,
        before_sleep=warn,
        sleep=sleep,
        reraise=True,
    )
    result = retrying(call)
    if began:
        log.warning("%s: database reachable again after %.1f s", what, time.monotonic() - began[0])
    return result


class OutageWait:
    """The pace of a loop (a worker polling for jobs) while the database is away.

    :meth:`failed` returns how long to wait before trying again: the loop's own
    poll interval first, doubling to ``max_s``; it logs the outage when it begins,
    as the wait grows and then every tenth try, not at every poll. :meth:`succeeded`
    ends the outage and logs how long it lasted.
    """

    def __init__(self, what: str, poll_s: float, max_s: float = 30.0) -> None:
        self.what = what
        self.poll_s = max(0.1, poll_s)
        self.max_s = max(self.poll_s, max_s)
        self.since: float | None = None
        self.tries = 0
        self._next = self.poll_s

    def failed(self, error: BaseException) -> float:
        """The wait before the next try, after ``error`` (an outage)."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.tries, self._next = now, 0, self.poll_s
            log.warning("%s: database unavailable (%s); trying again until it answers", self.what, describe(error))
        elif self._next < self.max_s or self.tries % 10 == 0:  # as the wait grows, then every 10th try
            log.warning(
                "%s: database still unavailable after %.0f s (%s); next try in %.1f s",
                self.what,
                now - self.since,
                describe(error),
                self._next,
            )
        self.tries += 1
        wait, self._next = self._next, min(self.max_s, self._next * 2)
        return wait

    def succeeded(self) -> None:
        if self.since is not None:
            log.warning("%s: database reachable again after %.1f s", self.what, time.monotonic() - self.since)
            self.since = None


def describe(error: BaseException | None) -> str:
    """The first line of the driver's message, without SQLAlchemy's statement and parameters."""
    if error is None:
        return "no error"
    cause: BaseException = error
    if isinstance(error, sa_exc.DBAPIError) and error.orig is not None:
        cause = error.orig
    elif error.__cause__ is not None:
        return describe(error.__cause__)
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"[:300]
