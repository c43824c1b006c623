"""Writes need a bearer token; tokens are stored hashed; refused writes write nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from typer.testing import CliRunner

from server.app import create_app
from server.cli import app as cli
from server.settings import Settings
from server.store import tokens
from server.store.db import Database
from server.store.models import ApiToken
from tests.server.conftest import row_counts, workload_body

JOB = {"workload": workload_body(), "budget": 4}


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "a bearer token is required"),
        ({"authorization": "Bearer tt_not-a-real-token"}, 401, "unknown or revoked"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, 401, "expected 'Bearer <token>'"),
        ({"authorization": "Bearer"}, 401, "expected 'Bearer <token>'"),
        ({"authorization": "Bearer " + "x" * 600}, 401, "expected 'Bearer <token>'"),
    ],
)
def test_write_refused_without_valid_token(
    client: TestClient, db: Database, headers: dict[str, str], status: int, message: str
) -> None:
    before = row_counts(db)
    for method, path, body in (
        ("POST", "/v1/jobs", JOB),
        ("POST", "/v1/jobs/1/cancel", None),
        ("POST", "/v1/lookup", {"workload": workload_body(), "enqueue": True}),
    ):
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (path, response.text)
        assert message in response.json()["message"] and "authorization" in response.json()["message"]
        assert response.headers.get("www-authenticate") == "Bearer"
    assert row_counts(db) == before


def test_revoked_token_and_wrong_role_are_refused(
    client: TestClient, db: Database, writer_token: str, worker_token: str
) -> None:
    auth = {"authorization": f"Bearer {worker_token}"}
    before = row_counts(db)
    forbidden = client.post("/v1/jobs", json=JOB, headers=auth)
    assert forbidden.status_code == 403 and "role 'worker'" in forbidden.json()["message"]
    assert (
        client.post("/v1/lookup", json={"workload": workload_body(), "enqueue": True}, headers=auth).status_code == 403
    )
    assert row_counts(db) == before
    ok = client.post("/v1/jobs", json=JOB, headers={"authorization": f"Bearer {writer_token}"})
    assert ok.status_code == 201
    with db.transaction() as session:
        assert tokens.revoke_token(session, "writer-test")
    before = row_counts(db)
    revoked = client.post(
        "/v1/jobs",
        json={**JOB, "workload": workload_body(batch=3)},
        headers={"authorization": f"Bearer {writer_token}"},
    )
    assert revoked.status_code == 401 and row_counts(db) == before


def test_tokens_are_stored_hashed(db: Database, writer_token: str) -> None:
    with db.engine.connect() as conn:
        dump = " ".join(str(v) for row in conn.execute(text("SELECT * FROM tt_api_token")) for v in row)
    assert writer_token not in dump and writer_token[3:] not in dump
    with db.transaction() as session:
        row = session.scalar(select(ApiToken).where(ApiToken.name == "writer-test"))
        assert row is not None and row.token_hash == tokens.hash_token(writer_token) and len(row.token_hash) == 64
        assert tokens.verify_token(session, writer_token) is not None
        assert tokens.verify_token(session, writer_token + "x") is None
        with pytest.raises(ValueError, match="already exists"):
            tokens.create_token(session, "writer-test", "writer")
        with pytest.raises(ValueError, match="role must be one of"):
            tokens.create_token(session, "root", "superuser")


def test_reads_need_a_token_when_configured(database_url: str, db: Database, writer_token: str) -> None:
    settings = Settings(database_url=database_url, require_read_token=True)
    with TestClient(create_app(settings, db)) as client:
        assert client.get("/v1/configs").status_code == 401
        assert client.post("/v1/lookup", json={"workload": workload_body()}).status_code == 401
        auth = {"authorization": f"Bearer {writer_token}"}
        assert client.get("/v1/configs", headers=auth).status_code == 200
        assert client.post("/v1/lookup", json={"workload": workload_body()}, headers=auth).status_code == 200
        assert client.get("/healthz").status_code == 200  # health stays open


def test_token_cli_create_revoke_list(database_url: str, db: Database) -> None:
    runner = CliRunner()
    created = runner.invoke(
        cli, ["token", "create", "--name", "ci-bot", "--role", "admin", "--database-url", database_url]
    )
    assert created.exit_code == 0, created.output
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("tt_")
    with db.transaction() as session:
        row = tokens.verify_token(session, token)
        assert row is not None and row.role == "admin"
    listed = runner.invoke(cli, ["token", "list", "--database-url", database_url])
    assert "ci-bot" in listed.stdout and token not in listed.stdout
    assert runner.invoke(cli, ["token", "revoke", "ci-bot", "--database-url", database_url]).exit_code == 0
    assert runner.invoke(cli, ["token", "revoke", "ci-bot", "--database-url", database_url]).exit_code == 2
    bad = runner.invoke(cli, ["token", "create", "--name", "x", "--role", "root", "--database-url", database_url])
    assert bad.exit_code == 2 and "role must be one of" in bad.output
    with db.transaction() as session:
        assert tokens.verify_token(session, token) is None
