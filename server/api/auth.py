"""Bearer-token auth: tokens are stored hashed and compared in constant time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from server.api.deps import DatabaseDep, ReadSessionDep, SettingsDep
from server.store import tokens
from server.store.models import ApiToken

# Which roles may do what: admins everything; writers queue and cancel jobs;
# workers (tuning workers, a later issue) write trials and claim jobs.
WRITE_ROLES = ("writer", "admin")


def _token_from(request: Request) -> str | None:
    try:
        return tokens.bearer_token(request.headers.get("authorization"))
    except ValueError as exc:
        raise HTTPException(401, str(exc), {"WWW-Authenticate": "Bearer"}) from None


def authenticate(request: Request, session: Session, required: bool) -> ApiToken | None:
    token = _token_from(request)
    if token is None:
        if required:
            raise HTTPException(401, "authorization: a bearer token is required", {"WWW-Authenticate": "Bearer"})
        return None
    row = tokens.verify_token(session, token)
    if row is None:
        raise HTTPException(401, "authorization: unknown or revoked token", {"WWW-Authenticate": "Bearer"})
    return row


def require_roles(*roles: str) -> Callable[..., ApiToken]:
    """A dependency that admits only tokens with one of ``roles``."""

    def dependency(request: Request, session: ReadSessionDep) -> ApiToken:
        row = authenticate(request, session, required=True)
        assert row is not None
        if row.role not in roles:
            raise HTTPException(403, f"authorization: role {row.role!r} may not do this (needs {' or '.join(roles)})")
        return row

    return dependency


def read_access(request: Request, session: ReadSessionDep, settings: SettingsDep) -> None:
    """Reads are open unless TILETUNE_REQUIRE_READ_TOKEN is set."""
    authenticate(request, session, required=settings.require_read_token)


async def caller_token(request: Request, settings: SettingsDep, db: DatabaseDep) -> ApiToken | None:
    """The caller's token, for a route whose body is validated after it (FastAPI solves
    dependencies first): required when reads need a token, verified whenever one is sent,
    None for an anonymous caller of an open server. Async, with its one indexed query
    inline, so the common anonymous call costs no thread hop and no session."""
    if not settings.require_read_token and "authorization" not in request.headers:
        return None
    with db.read_sessions() as session:
        return authenticate(request, session, required=settings.require_read_token)


CallerDep = Annotated[ApiToken | None, Depends(caller_token)]
