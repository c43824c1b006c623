"""``tiletune up`` following its job's progress through a database outage."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from rich.console import Console
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from server.cli import up
from server.store import models
from server.store.db import Database
from tests.server.worker.workers import queue_replay_jobs


def failing_reads(db: Database, monkeypatch: pytest.MonkeyPatch, errors: list[Exception]) -> list[int]:
    """Make ``db``'s read sessions raise ``errors`` one by one, then work; the number of reads made."""
    real = db.read_sessions
    reads = [0]

    @contextlib.contextmanager
    def read_sessions() -> Iterator[Any]:
        reads[0] += 1
        if errors:
            raise errors.pop(0)
        with real() as session:
            yield session

    monkeypatch.setattr(db, "read_sessions", read_sessions)
    return reads


def refused() -> OperationalError:
    return OperationalError(None, {}, psycopg.OperationalError("connection refused"))


def test_up_waits_out_an_outage_while_it_follows_the_job(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    (job_id,) = queue_replay_jobs(db, 1, budget=4)
    with db.transaction() as session:
        session.execute(update(models.Job).where(models.Job.id == job_id).values(status="done"))
    monkeypatch.setattr(up, "FOLLOW_POLL_S", 0.01)
    reads = failing_reads(db, monkeypatch, [refused(), refused(), refused()])
    buffer = io.StringIO()
    status = up._follow(db, job_id, 4, [], threading.Event(), Console(file=buffer, width=120))
    assert status == "done" and reads[0] == 4
    assert "database unavailable, retrying" in buffer.getvalue()


def test_up_stops_on_an_error_that_is_not_an_outage(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    (job_id,) = queue_replay_jobs(db, 1, budget=4)
    monkeypatch.setattr(up, "FOLLOW_POLL_S", 0.01)
    wrong = OperationalError("SELECT 1", {}, psycopg.errors.UndefinedTable("no such table"))
    failing_reads(db, monkeypatch, [wrong])
    with pytest.raises(OperationalError):
        up._follow(db, job_id, 4, [], threading.Event(), Console(file=io.StringIO()))
