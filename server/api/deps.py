"""What the routes take through ``Depends``: settings, the database, sessions, read access, paging.

Settings and the database are the app's (``app.state``, set by
:func:`server.api.app.create_app`) and reach routes only through
:func:`get_settings` and :func:`get_database`, so a test swaps either with
``app.dependency_overrides``. The two getters are ``async``: FastAPI runs a
sync dependency in the thread pool, a hop the hot read paths cannot afford.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request
from sqlalchemy.orm import Session

from server.api.schemas import MAX_ID
from server.settings import Settings
from server.store import models
from server.store.db import Database


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[Database, Depends(get_database)]


def get_read_session(db: DatabaseDep) -> Iterator[Session]:
    """A session of the read pool (autocommit on PostgreSQL), closed after the request."""
    with db.read_sessions() as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


async def page_params(
    settings: SettingsDep,
    limit: Annotated[int | None, Query(ge=1, description="Page size (bounded by the server)")] = None,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_ID, description="next_cursor of the previous page")] = None,
) -> tuple[int, int | None]:
    if limit is not None and limit > settings.max_page_size:
        raise HTTPException(422, f"limit: must be <= {settings.max_page_size}")
    return limit or settings.default_page_size, cursor


PageDep = Annotated[tuple[int, int | None], Depends(page_params)]


def workload_or_404(session: Session, key: str) -> models.Workload:
    from server.store.workloads import find_workload

    row = find_workload(session, key)
    if row is None:
        raise HTTPException(404, f"workload_key: no workload with key {key!r}")
    return row


def job_or_404(session: Session, job_id: int) -> models.Job:
    job = session.get(models.Job, job_id)
    if job is None:
        raise HTTPException(404, f"job_id: no job {job_id}")
    return job
