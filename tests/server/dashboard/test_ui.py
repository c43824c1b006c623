"""The /ui dashboard through the ASGI app: pages, figures and their cache, read auth, and bad input.

Runs on SQLite and, with TILETUNE_TEST_DATABASE_URL, on PostgreSQL (the
fixtures of tests/server/conftest.py). The browser test is tests/e2e.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.dashboard import figures
from server.dashboard.routes import COOKIE
from server.settings import Settings
from server.store import records, tokens, workloads
from server.store.db import Database
from tests.images import png_size
from tests.seeding import Seeded, seed_tuned_workload

HTML = {"Accept": "text/html"}


@pytest.fixture
def seeded(db: Database) -> Seeded:
    return seed_tuned_workload(db)


@pytest.fixture
def locked(database_url: str, db: Database) -> Iterator[TestClient]:
    """A client of an app whose reads need a token."""
    settings = Settings(database_url=database_url, require_read_token=True)
    with TestClient(create_app(settings, db), follow_redirects=False) as c:
        yield c


def test_dashboard_lists_configs_and_jobs(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'href="/ui/workloads/{seeded.key}"' in page.text
    assert seeded.winner.describe() in page.text
    # Job progress as GET /v1/jobs reports it: measured / budget, being measured, best so far, workers.
    assert f"{seeded.trials - 1} / 48" in page.text  # the invalid proposal is not a measured trial
    assert "1 / 32" in page.text and "(+1 running)" in page.text and "seed-worker (1)" in page.text
    assert "cpu-demo" in page.text


@pytest.mark.parametrize(
    ("query", "listed"),
    [
        ("device_kind=cpu", True),
        ("device_kind=TPU+v6+lite", False),
        ("preset=cpu-demo", True),
        ("preset=wan2.1-720p", False),
        ("device_kind=cpu&preset=cpu-demo", True),
        ("device_kind=&preset=", True),  # the form's "(all)"
    ],
)
def test_dashboard_filters(client: TestClient, seeded: Seeded, query: str, listed: bool) -> None:
    page = client.get(f"/ui?{query}")
    assert page.status_code == 200
    configs = page.text.split('id="configs"')[1].split("</table>")[0]
    assert (seeded.key in configs) is listed


def test_workload_page_and_figures(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/ui/workloads/{seeded.key}")
    assert page.status_code == 200
    assert page.text.count("<figure") == 4 and "child killed by SIGKILL" in page.text
    for name in figures.FIGURES:
        src = f"/ui/workloads/{seeded.key}/figures/{name}.png"
        assert src in page.text
        png = client.get(src)
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        width, height = png_size(png.content)
        assert f'width="{width}" height="{height}"' in page.text.split(src)[1].split(">")[0]
    only_failed = client.get(f"/ui/workloads/{seeded.key}?status=failed")
    assert only_failed.status_code == 200
    assert "RESOURCE_EXHAUSTED" in only_failed.text and "child killed" not in only_failed.text


def test_figures_are_cached_until_a_trial_is_added(client: TestClient, db: Database, seeded: Seeded) -> None:
    url = f"/ui/workloads/{seeded.key}/figures/history.png"
    first = client.get(url)
    etag = first.headers["etag"]
    assert first.headers["cache-control"] == "private, no-cache"
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
    assert client.get(url).content == first.content
    with db.transaction() as session:
        row = workloads.find_workload(session, seeded.key)
        assert row is not None
        records.record_trial(session, row, seeded.winner.to_dict(), "crashed", number=99, error="segfault")
    changed = client.get(url, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.content != first.content


def test_a_workload_being_tuned_has_figures(client: TestClient, seeded: Seeded) -> None:
    """No tuned config yet, one trial measured and one running: every figure still renders."""
    page = client.get(f"/ui/workloads/{seeded.other_key}")
    assert page.status_code == 200 and "none yet" in page.text
    assert '<td class="status-running">running</td>' in page.text
    for name in figures.FIGURES:
        assert png_size(client.get(f"/ui/workloads/{seeded.other_key}/figures/{name}.png").content)


BAD_INPUT = [
    ("/ui/workloads/xyz", 422, "workload_key: must be 32 lowercase hexadecimal characters"),
    ("/ui/workloads/" + "A" * 32, 422, "workload_key:"),
    ("/ui/workloads/%00", 422, "workload_key:"),
    ("/ui/workloads/" + "0" * 32, 404, "workload_key: no workload with key"),
    ("/ui/workloads/" + "0" * 32 + "/figures/history.png", 404, "workload_key: no workload with key"),
    ("/ui/workloads/xyz/figures/history.png", 422, "workload_key:"),
    ("/ui/workloads/{key}/figures/nope.png", 404, "figure: unknown figure 'nope.png'"),
    ("/ui/workloads/{key}/figures/history", 404, "figure: unknown figure 'history'"),
    ("/ui/workloads/{key}?status=bogus", 422, "status: must be one of"),
    ("/ui/workloads/{key}?status=" + "x" * 40, 422, "status: at most 16 characters"),
    ("/ui?preset=nope", 422, "preset: unknown preset 'nope'"),
    ("/ui?device_kind=" + "x" * 65, 422, "device_kind: at most 64 characters"),
    ("/ui?device_kind=cpu%00", 422, "device_kind: must not contain NUL"),
    ("/ui?token=not-a-token", 401, "token: unknown or revoked token"),
]


@pytest.mark.parametrize(("path", "status", "message"), BAD_INPUT)
def test_bad_input_gets_a_4xx_naming_the_field(
    client: TestClient, seeded: Seeded, path: str, status: int, message: str
) -> None:
    path = path.replace("{key}", seeded.key)
    answer = client.get(path)
    assert answer.status_code == status, answer.text[:300]
    assert message in answer.json()["message"]
    as_html = client.get(path, headers=HTML)
    assert as_html.status_code == status and as_html.headers["content-type"].startswith("text/html")
    assert message.split("'")[0] in as_html.text


def test_reads_need_a_token_when_required(locked: TestClient, db: Database, seeded: Seeded) -> None:
    with db.transaction() as session:
        token = tokens.create_token(session, "reader", "worker")
    for path in ("/ui", f"/ui/workloads/{seeded.key}", f"/ui/workloads/{seeded.key}/figures/history.png"):
        denied = locked.get(path, headers=HTML)
        assert denied.status_code == 401 and seeded.key[:12] not in denied.text.replace(path, "")
        assert 'name="token"' in denied.text  # the sign-in form
        assert locked.get(path).json()["message"].startswith("authorization:")
        assert locked.get(path, headers={"Authorization": "Bearer tt_wrong"}).status_code == 401
        assert locked.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200

    # ?token= once: a cookie, and a redirect to the same URL without the token.
    signed = locked.get(f"/ui/workloads/{seeded.key}?status=ok&token={token}")
    assert signed.status_code == 303 and signed.headers["location"] == f"/ui/workloads/{seeded.key}?status=ok"
    cookie = signed.headers["set-cookie"]
    assert f"{COOKIE}={token}" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/ui" in cookie
    assert locked.get(f"/ui/workloads/{seeded.key}/figures/blockmap.png").status_code == 200
    assert locked.get("/v1/configs").status_code == 401  # the cookie is the dashboard's only

    # Signing out drops it; a revoked token stops working.
    out = locked.get("/ui/logout")
    assert (
        out.status_code == 303
        and f"{COOKIE}=" in out.headers["set-cookie"]
        and "Max-Age=0" in out.headers["set-cookie"]
    )
    locked.cookies.clear()
    assert locked.get("/ui").status_code == 401
    locked.cookies.set(COOKIE, token)
    with db.transaction() as session:
        tokens.revoke_token(session, "reader")
    assert locked.get("/ui").status_code == 401


def test_sign_in_form(locked: TestClient, db: Database, seeded: Seeded) -> None:
    with db.transaction() as session:
        token = tokens.create_token(session, "reader", "worker")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = locked.post("/ui/login", content=f"token=tt_nope&next=/ui/workloads/{seeded.key}", headers={**form, **HTML})
    assert wrong.status_code == 401 and "token: unknown or revoked token" in wrong.text
    assert f'name="next" value="/ui/workloads/{seeded.key}"' in wrong.text  # the form returns there
    crowded = locked.post("/ui/login", content="&".join(f"f{i}=x" for i in range(20)), headers=form)
    assert crowded.status_code == 422 and crowded.json()["message"].startswith("body:")
    assert locked.post("/ui/login", content="next=/ui", headers=form).json()["message"] == "token: required"
    ok = locked.post("/ui/login", content=f"token={token}&next=/ui/workloads/{seeded.key}", headers=form)
    assert ok.status_code == 303 and ok.headers["location"] == f"/ui/workloads/{seeded.key}"
    assert locked.get(f"/ui/workloads/{seeded.key}").status_code == 200
    away = locked.post("/ui/login", content=f"token={token}&next=https://example.org/", headers=form)
    assert away.headers["location"] == "/ui"  # never redirected off the dashboard


def test_ui_is_not_in_the_api_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
