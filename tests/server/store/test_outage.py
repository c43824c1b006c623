"""What counts as a database outage, and riding one out (server.store.outage).

The real thing -- connections cut and refused on PostgreSQL -- is in
tests/server/worker/test_outage.py and tests/server/api/test_database_outage.py; here
each rule of :func:`is_outage` is checked on the errors the drivers raise."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import optuna
import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.orm import Session

from server.store.db import Database
from server.store.outage import OutageWait, Patience, is_outage, ride_out


def wrapped(orig: Exception, statement: str | None = "SELECT 1", **kwargs: bool) -> sa_exc.DBAPIError:
    """``orig`` as SQLAlchemy raises it (the class it maps the driver's error to)."""
    base = sqlite3.Error if isinstance(orig, sqlite3.Error) else psycopg.Error
    return sa_exc.DBAPIError.instance(statement, {}, orig, base, **kwargs)


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),  # 57P01
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),  # 57P03
        (psycopg.errors.ConnectionFailure("connection failure"), True),  # 08006
        (psycopg.errors.TooManyConnections("too many clients"), True),  # 53300
        (psycopg.errors.SerializationFailure("could not serialize access"), True),  # 40001
        (psycopg.errors.DeadlockDetected("deadlock detected"), True),  # 40P01
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no answer, no SQLSTATE
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),  # 57014
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.errors.UndefinedTable("relation does not exist"), False),
        (psycopg.errors.DiskFull("no space left on device"), False),  # 53100: not one that passes by itself
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("no such table: tt_job"), False),
        (sqlite3.IntegrityError("UNIQUE constraint failed"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_an_outage_is_told_from_a_fault_of_the_statement(error: Exception, outage: bool) -> None:
    assert is_outage(wrapped(error)) is outage


def test_connecting_failures_broken_connections_and_causes_count() -> None:
    refused = psycopg.OperationalError('connection failed: FATAL:  database "x" is not currently accepting connections')
    assert is_outage(wrapped(refused, statement=None))  # raised while connecting
    assert not is_outage(wrapped(sqlite3.OperationalError("unable to open database file"), statement=None))
    broken = wrapped(psycopg.errors.UndefinedTable("x"), connection_invalidated=True)
    assert is_outage(broken)  # SQLAlchemy found the connection gone, whatever the message
    try:
        try:
            raise wrapped(psycopg.errors.AdminShutdown("bye"))
        except sa_exc.SQLAlchemyError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as storage_error:
        assert is_outage(storage_error)  # Optuna's error around the outage
    assert not is_outage(optuna.exceptions.StorageInternalError("no cause"))
    # Optuna's _get_trials queries again in its own error handling, on the session whose
    # connection just broke: SQLAlchemy answers PendingRollbackError, Optuna wraps that.
    for first, outage in (
        (wrapped(psycopg.errors.AdminShutdown("bye")), True),
        (wrapped(psycopg.errors.UniqueViolation("dup")), False),
    ):
        try:
            try:
                try:
                    raise first
                except sa_exc.SQLAlchemyError:
                    raise sa_exc.PendingRollbackError("Can't reconnect until invalid transaction is rolled back.")  # noqa: B904
            except sa_exc.SQLAlchemyError as e:
                raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
        except optuna.exceptions.StorageInternalError as storage_error:
            assert is_outage(storage_error) is outage
    try:
        try:
            raise wrapped(psycopg.errors.AdminShutdown("bye"))
        except sa_exc.SQLAlchemyError:
            raise ValueError("a bug in the handler") from None
    except ValueError as bug:
        assert not is_outage(bug)  # raised while an outage was handled, not from it
    try:
        try:
            raise wrapped(psycopg.errors.AdminShutdown("bye"))
        except sa_exc.SQLAlchemyError:
            raise KeyError("a bug in the handler")  # noqa: B904 (the implicit context is the case tested)
    except KeyError as bug:
        assert not is_outage(bug)
    assert not is_outage(RuntimeError("a bug"))


def test_ride_out_retries_outages_only_for_a_bounded_time_or_until_stopped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tiletune.store")
    calls: list[float] = []

    def flaky() -> int:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise wrapped(psycopg.errors.AdminShutdown("bye"))
        return 7

    assert ride_out(flaky, what="flaky", patience=30) == 7 and len(calls) == 3
    logged = [r.getMessage() for r in caplog.records]
    # The outage's start and end; the second retry is not logged (every LOG_EVERY-th is).
    assert len(logged) == 2 and "flaky: database unavailable for 0 s (AdminShutdown: bye)" in logged[0], logged
    assert logged[1].startswith("flaky: database reachable again after "), logged

    calls.clear()

    def wrong() -> None:
        calls.append(time.monotonic())
        raise wrapped(psycopg.errors.UniqueViolation("duplicate key"))

    with pytest.raises(sa_exc.DBAPIError):
        ride_out(wrong, what="wrong", patience=30)
    assert len(calls) == 1  # a fault of the statement is raised at once

    calls.clear()

    def down() -> None:
        calls.append(time.monotonic())
        raise wrapped(psycopg.errors.CannotConnectNow("starting up"))

    start = time.monotonic()
    with pytest.raises(sa_exc.DBAPIError):
        ride_out(down, what="down", patience=1.0)
    assert len(calls) >= 2 and time.monotonic() - start < 10  # gave up after about a second

    calls.clear()
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    start = time.monotonic()
    with pytest.raises(sa_exc.DBAPIError):
        ride_out(down, what="running", patience=Patience(0.2, until=stop))
    waited = time.monotonic() - start
    # A running worker waits past its seconds, until it is asked to stop (then at once: 2 s > 0.2 s).
    assert 2.0 <= waited < 8 and len(calls) >= 4, (waited, len(calls))

    calls.clear()
    start = time.monotonic()
    with pytest.raises(sa_exc.DBAPIError):
        ride_out(down, what="stopping", patience=Patience(1.0, until=stop))
    # Asked to stop before the outage: it still rides out its seconds.
    assert len(calls) >= 2 and time.monotonic() - start < 10


def test_a_database_retries_a_whole_unit_of_work_through_an_outage(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'units.db'}")
    with db.transaction() as session:
        session.execute(text("CREATE TABLE unit (x INTEGER)"))
    tries: list[int] = []

    def insert(session: Session) -> int:
        session.execute(text("INSERT INTO unit VALUES (1)"))
        tries.append(1)
        if len(tries) == 1:  # the connection breaks after the first statement of the first try
            raise wrapped(psycopg.errors.AdminShutdown("terminating connection"))
        return len(tries)

    def count(session: Session) -> int:
        return int(session.execute(text("SELECT count(*) FROM unit")).scalar_one())

    assert db.transact(insert, what="inserting", patience=30) == 2
    assert db.read(count, what="counting", patience=30) == 1  # the first try was rolled back whole

    tries.clear()

    def wrong(session: Session) -> None:
        session.execute(text("INSERT INTO unit VALUES (2)"))
        tries.append(1)
        raise wrapped(psycopg.errors.UniqueViolation("duplicate key"))

    with pytest.raises(sa_exc.DBAPIError):
        db.transact(wrong, what="wrong", patience=30)
    assert len(tries) == 1 and db.read(count, what="counting", patience=30) == 1

    reads: list[int] = []

    def flaky_count(session: Session) -> int:
        reads.append(1)
        if len(reads) < 3:
            raise wrapped(psycopg.errors.CannotConnectNow("starting up"), statement=None)
        return count(session)

    assert db.read(flaky_count, what="counting", patience=30) == 1 and len(reads) == 3
    db.dispose()


def test_outage_wait_backs_off_logs_sparingly_and_resets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tiletune.store")
    error = wrapped(psycopg.errors.AdminShutdown("bye"))
    pace = OutageWait("worker w", poll_s=0.5, max_s=4.0)
    waits = [pace.failed(error) for _ in range(25)]
    assert waits[:5] == [0.5, 1.0, 2.0, 4.0, 4.0] and set(waits[4:]) == {4.0}
    messages = [r.getMessage() for r in caplog.records]
    assert "database unavailable (AdminShutdown: bye)" in messages[0]
    assert 3 < len(messages) < 10  # as the wait grows, then every tenth try: not at each of the 25
    caplog.clear()
    pace.succeeded()
    pace.succeeded()
    assert len(caplog.records) == 1 and "reachable again after" in caplog.records[0].getMessage()
    assert pace.failed(error) == 0.5  # a new outage starts from the poll interval
