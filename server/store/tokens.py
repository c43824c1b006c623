"""API tokens: stored as SHA-256 hashes only, compared in constant time.

Functions take a session and never commit: the caller's
:meth:`~server.store.db.Database.transaction` does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.store.models import TOKEN_ROLES, ApiToken

TOKEN_PREFIX = "tt_"
MAX_TOKEN_LENGTH = 512  # far above a real token (tt_ + 43 characters); longer input is not looked up


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without the header);
    ValueError naming the expected form when the header is malformed."""
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip() or len(value) > MAX_TOKEN_LENGTH:
        raise ValueError("authorization: expected 'Bearer <token>'")
    return value.strip()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: str) -> str:
    """Create a token; the plaintext is returned once and never stored."""
    if role not in TOKEN_ROLES:
        raise ValueError(f"role must be one of {TOKEN_ROLES}, got {role!r}")
    if not name or len(name) > 100:
        raise ValueError("token name must be 1-100 characters")
    if session.scalar(select(ApiToken).where(ApiToken.name == name)) is not None:
        raise ValueError(f"a token named {name!r} already exists")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, role=role, token_hash=hash_token(token)))
    session.flush()
    return token


def verify_token(session: Session, token: str) -> ApiToken | None:
    """The active token matching ``token``, compared in constant time, or None."""
    if len(token) > MAX_TOKEN_LENGTH:
        return None
    digest = hash_token(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
        return None
    return row


def revoke_token(session: Session, name: str) -> bool:
    row = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = dt.datetime.now(dt.UTC)
    return True


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.id)).all()
