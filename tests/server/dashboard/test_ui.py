"""The /ui dashboard through the ASGI app: pages, figures and their cache, read auth, and bad input.

Runs on SQLite and, with TILETUNE_TEST_DATABASE_URL, on PostgreSQL (the
fixtures of tests/server/conftest.py). The browser test is tests/e2e.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlencode, urljoin, urlsplit

import hypothesis
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.workload import Workload
from server.app import create_app
from server.dashboard import figures
from server.dashboard.routes import COOKIE, FigureCache
from server.settings import Settings
from server.store import records, tokens, workloads
from server.store.db import Database
from tests.images import png_size
from tests.seeding import DENSE_MS, VERSIONS, Seeded, seed_tuned_workload

HTML = {"Accept": "text/html"}
SAME_ORIGIN = {"Origin": "http://testserver"}  # TestClient's host
HYPOTHESIS = hypothesis.settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def seeded(db: Database) -> Seeded:
    return seed_tuned_workload(db)


@pytest.fixture
def reader(db: Database) -> str:
    """A token of the worker role (any role may read)."""
    with db.transaction() as session:
        return tokens.create_token(session, "reader-test", "worker")


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


def test_both_speedups_are_shown_with_their_kept_spread(client: TestClient, db: Database, seeded: Seeded) -> None:
    """The list and the workload page name both anchors and give each speedup's stored p10-p90 as the CLI
    prints it; a config published without the spread shows the bare ratio, one without an anchor a dash."""
    with db.transaction() as session:
        row = workloads.find_workload(session, seeded.key)
        assert row is not None
        tuned = records.current_config(session, row.id)
        assert tuned is not None and tuned.speedup and tuned.speedup_vs_tiled_dense and tuned.speedup_p10_p90
        (d10, d90), (t10, t90) = tuned.speedup_p10_p90["dense"], tuned.speedup_p10_p90["tiled_dense"]
        over_dense = f"{tuned.speedup:.2f}x (p10-p90 {d10:.2f}-{d90:.2f})"
        over_tiled = f"{tuned.speedup_vs_tiled_dense:.2f}x (p10-p90 {t10:.2f}-{t90:.2f})"
        median_ms, config = tuned.median_ms, tuned.config
    configs = client.get("/ui").text.split('id="configs"')[1].split("</table>")[0]
    assert f'<td class="num">{over_dense}</td><td class="num">{over_tiled}</td>' in configs
    page = client.get(f"/ui/workloads/{seeded.key}").text
    assert f"{over_dense} over jax.nn.dot_product_attention; {over_tiled} over tiled dense" in page
    with db.transaction() as session:  # republished as a config stored before migration 0007 would be
        row = workloads.find_workload(session, seeded.key)
        assert row is not None
        records.publish_tuned_config(session, row, config, median_ms=median_ms, dense_ms=DENSE_MS, versions=VERSIONS)
    page = client.get(f"/ui/workloads/{seeded.key}").text
    assert f"{DENSE_MS / median_ms:.2f}x over jax.nn.dot_product_attention; - over tiled dense" in page
    assert f"p10-p90 {d10:.2f}" not in page


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

    # Signing out (a POST from the page's own button) drops it; a revoked token stops working.
    page = locked.get("/ui/logout")
    assert page.status_code == 200 and 'method="post"' in page.text and "set-cookie" not in page.headers
    out = locked.post("/ui/logout", headers=SAME_ORIGIN)
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
    form = {"Content-Type": "application/x-www-form-urlencoded", **SAME_ORIGIN}
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


# ---------------------------------------------------------------- forms from this site only

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
HOSTS = st.sampled_from(["evil.example", "testserver.evil.example", "evil.testserver", "127.0.0.1", "localhost"])


@st.composite
def foreign_sources(draw: st.DrawFn) -> dict[str, str]:
    """Origin / Referer headers of a post that does not come from this server's pages (or says nothing)."""
    scheme = draw(st.sampled_from(["http", "https", "ftp"]))
    host = draw(st.one_of(HOSTS, st.just("testserver")))
    port = draw(st.sampled_from(["", ":80", ":8000", ":443"]))
    source = f"{scheme}://{host}{port}"
    if source in ("http://testserver", "https://testserver"):
        source = "http://evil.example"
    kind = draw(st.sampled_from(["origin", "referer", "both", "null", "none"]))
    if kind == "origin":
        return {"Origin": source}
    if kind == "referer":
        return {"Referer": source + "/ui/workloads"}
    if kind == "both":  # a page's own Referer does not excuse a foreign Origin
        return {"Origin": source, "Referer": "http://testserver/ui"}
    return {"Origin": "null"} if kind == "null" else {}


@HYPOTHESIS
@given(source=foreign_sources())
def test_sign_in_and_out_are_refused_from_other_sites(
    source: dict[str, str], locked: TestClient, db: Database, reader: str
) -> None:
    """Login CSRF: another site's form (or one whose origin cannot be told) cannot sign a browser in
    with the attacker's token, nor sign it out. (Before: both were accepted.)"""
    locked.cookies.clear()
    signed_in = locked.post("/ui/login", content=f"token={reader}&next=/ui", headers={**FORM, **source})
    assert signed_in.status_code == 403 and "set-cookie" not in signed_in.headers
    assert signed_in.json()["message"].startswith("origin: signing in is accepted only from this server's own pages")
    locked.cookies.set(COOKIE, reader)
    signed_out = locked.post("/ui/logout", headers=source)
    assert signed_out.status_code == 403 and "set-cookie" not in signed_out.headers
    assert locked.get("/ui/logout").status_code == 200  # the button page; it changes nothing
    assert locked.get("/ui").status_code == 200  # still signed in


@pytest.mark.parametrize("source", [{"Origin": "http://testserver"}, {"Referer": "http://testserver/ui?x=1"}])
def test_sign_in_and_out_from_this_site(source: dict[str, str], locked: TestClient, reader: str) -> None:
    signed_in = locked.post("/ui/login", content=f"token={reader}&next=/ui", headers={**FORM, **source})
    assert signed_in.status_code == 303 and f"{COOKIE}={reader}" in signed_in.headers["set-cookie"]
    assert locked.get("/ui").status_code == 200
    signed_out = locked.post("/ui/logout", headers=source)
    assert signed_out.status_code == 303 and "Max-Age=0" in signed_out.headers["set-cookie"]


@pytest.mark.parametrize(
    ("fetch_site", "signs_in"),
    [("cross-site", False), ("same-site", False), ("none", True), ("same-origin", True), (None, True)],
)
def test_a_token_link_signs_in_only_when_opened_directly(
    fetch_site: str | None, signs_in: bool, locked: TestClient, reader: str
) -> None:
    """A ``?token=`` link on another site would sign the visitor in with that site's token (login
    CSRF by GET). (Before: the cookie was set whatever the link's origin.)"""
    headers = {"Sec-Fetch-Site": fetch_site} if fetch_site else {}
    answer = locked.get(f"/ui?token={reader}", headers=headers)
    if signs_in:
        assert answer.status_code == 303 and f"{COOKIE}={reader}" in answer.headers["set-cookie"]
    else:
        assert answer.status_code == 403 and "set-cookie" not in answer.headers
        assert answer.json()["message"].startswith("token: a ?token= sign-in link works when opened directly")


def _cookie_attributes(header: str) -> dict[str, str]:
    """The attributes of one Set-Cookie header (lower-cased names), without the value and expiry."""
    parts = [p.strip() for p in header.split(";")[1:]]
    attributes = {name.lower(): value for name, _, value in (p.partition("=") for p in parts)}
    return {k: v for k, v in attributes.items() if k not in ("expires", "max-age")}


def test_the_cookie_is_set_and_deleted_with_the_same_attributes(locked: TestClient, reader: str) -> None:
    """(Before: set SameSite=strict and HttpOnly, deleted SameSite=lax without HttpOnly.)"""
    set_ = locked.post("/ui/login", content=f"token={reader}", headers={**FORM, **SAME_ORIGIN})
    by_url = locked.get(f"/ui?token={reader}")
    deleted = locked.post("/ui/logout", headers=SAME_ORIGIN)
    expected = {"httponly": "", "path": "/ui", "samesite": "strict"}
    for answer in (set_, by_url, deleted):
        assert _cookie_attributes(answer.headers["set-cookie"]) == expected, answer.headers["set-cookie"]


@st.composite
def next_targets(draw: st.DrawFn) -> str:
    """``next`` values built from the pieces of open redirects: dot segments (plain and escaped),
    slashes and backslashes, schemes, hosts, control characters."""
    pieces = st.sampled_from(
        ["/", "ui", "..", ".", "%2e", "%2E%2e", "%2e.", "\\", "%5c", "//", "%2f", "evil", "evil.example",
         "http:", "https:", "javascript:", "@", "?", "#", ":", "\t", "\n", "ui2", "workloads", ";", "%00"]
    )  # fmt: skip
    start = draw(st.sampled_from(["/ui", "/ui/", "/", "", "//", "/ui/.."]))
    return start + "".join(draw(st.lists(pieces, max_size=8)))


def _browser_destination(location: str) -> tuple[str, str]:
    """(host, path) a browser on http://testserver/ui/login goes to for ``location``: backslashes read as
    slashes, tabs and newlines dropped, %2e read as a dot in dot segments, then RFC 3986 resolution."""
    cleaned = location.replace("\\", "/").replace("\t", "").replace("\n", "").replace("\r", "")
    cleaned = re.sub("%2e", ".", cleaned, flags=re.IGNORECASE)
    resolved = urlsplit(urljoin("http://testserver/ui/login", cleaned))
    return resolved.netloc, resolved.path


@HYPOTHESIS
@given(target=next_targets())
def test_sign_in_redirects_stay_inside_the_dashboard(target: str, locked: TestClient, reader: str) -> None:
    """(Before: ``next=/ui/../../evil`` passed the prefix check and led to /evil.)"""
    answer = locked.post(
        "/ui/login", content=urlencode({"token": reader, "next": target}), headers={**FORM, **SAME_ORIGIN}
    )
    assert answer.status_code == 303
    host, path = _browser_destination(answer.headers["location"])
    assert host == "testserver" and (path == "/ui" or path.startswith("/ui/")), (target, answer.headers["location"])


def test_sign_in_keeps_a_legitimate_next(locked: TestClient, reader: str, seeded: Seeded) -> None:
    target = f"/ui/workloads/{seeded.key}?status=ok"
    answer = locked.post(
        "/ui/login", content=urlencode({"token": reader, "next": target}), headers={**FORM, **SAME_ORIGIN}
    )
    assert answer.headers["location"] == target


# ---------------------------------------------------------------- bounded figures


@HYPOTHESIS
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=60), budget=st.integers(0, 20000))
def test_the_figure_cache_is_bounded_by_bytes(sizes: list[int], budget: int) -> None:
    """The kept PNGs never pass the byte budget, whatever their sizes, and the newest that fits is kept."""
    cache = FigureCache(budget)
    for i, size in enumerate(sizes):
        cache.put(("k", i), bytes(size))
        kept = [cache.get(("k", j)) for j in range(i + 1)]
        assert cache.nbytes == sum(len(p) for p in kept if p is not None) <= budget
        if size <= budget:
            assert kept[i] is not None  # the newest figure that fits is kept


def test_a_stored_huge_workload_gets_its_block_map(client: TestClient, db: Database) -> None:
    """A workload the API would refuse, stored by a worker or ``tiletune tune``: 2^24 tokens of one
    dense head. Its block map is a coarse one, drawn in a child, and the page renders."""
    pattern = SparsityPattern(VideoLayout(4096, 4096), (HeadPattern.dense(),))
    with db.transaction() as session:
        row = workloads.workload_row(session, Workload("cpu", "xla", "float32", 1, 64, pattern))
        key = row.key
    answer = client.get(f"/ui/workloads/{key}/figures/blockmap.png")
    assert answer.status_code == 200 and answer.content.startswith(b"\x89PNG")
    page = client.get(f"/ui/workloads/{key}")
    assert page.status_code == 200
