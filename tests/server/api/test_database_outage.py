"""The API through a PostgreSQL outage: a cut connection fails the one request that meets it
with a 503 naming the database (never a 500), the pool reconnects for the next; while the
database refuses connections every database route answers 503 and /healthz stays up; when it
is back everything answers again, without a restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.bench.crash import scratch_database
from server.settings import Settings
from server.store.migrate import upgrade
from tests.server.conftest import workload_body
from tests.server.outages import cut_connections, refused

pytestmark = pytest.mark.postgres


@pytest.fixture
def client_url(postgres_url: str) -> Iterator[tuple[TestClient, str]]:
    with scratch_database(postgres_url, "apiout") as url:
        upgrade(url)
        with TestClient(create_app(Settings(database_url=url)), raise_server_exceptions=False) as client:
            yield client, url


def statuses(client: TestClient, n: int) -> list[int]:
    answers = []
    for i in range(n):
        if i % 2:
            r = client.post("/v1/lookup", json={"workload": workload_body(batch=1 + i)})
        else:
            r = client.get("/v1/trials?limit=5")
        if r.status_code == 503:
            assert r.json()["message"] == "database: unavailable, retry later", r.text
        answers.append(r.status_code)
    return answers


def test_the_api_answers_503_through_an_outage_and_recovers_by_itself(client_url: tuple[TestClient, str]) -> None:
    client, url = client_url
    assert set(statuses(client, 10)) == {200}
    for _ in range(3):
        held = cut_connections(url)
        assert held >= 1  # the server's pooled connections
        after = statuses(client, 10)
        assert set(after) <= {200, 503} and after.count(503) <= held, after
        assert after[-4:] == [200, 200, 200, 200], after  # reconnected
    with refused(url):
        assert set(statuses(client, 6)) == {503}
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
    assert statuses(client, 6)[-4:] == [200, 200, 200, 200]
    assert client.get("/readyz").status_code == 200
