"""The ``/ui`` dashboard: tuned configs, jobs, and a page per workload with its figures and trials.

Server-rendered HTML (:mod:`server.dashboard.pages`) and PNG figures rendered on request
by :mod:`server.dashboard.figures` (the code of ``tiletune report``), cached per workload
until a trial or a tuned config is added (the cache key and the ETag are the
workload key with its latest trial id and current tuned config id).

Routes (kept out of the OpenAPI document, which describes the JSON API):
 - ``GET /ui``: current tuned configs, filterable by ``device_kind`` and
   ``preset``, and the newest jobs with their progress;
 - ``GET /ui/workloads/{key}``: one workload (``?status=`` filters its trials);
 - ``GET /ui/workloads/{key}/figures/{name}.png``: one figure (``history``, ``heatmap``,
   ``blockmap``, ``speedup``), drawn in a child process (:mod:`server.dashboard.renderer`)
   while the event loop and the thread pool serve other requests; a figure that
   cannot be drawn now gets a 503 with ``Retry-After`` (422 over the memory budget);
 - ``POST /ui/login`` (form fields ``token`` and ``next``), ``POST /ui/logout``, and
   ``GET /ui/logout``, a page with the sign-out button (a GET changes nothing).

Read auth: with ``TILETUNE_REQUIRE_READ_TOKEN`` set, every ``/ui`` route needs
a token of any role, as the JSON reads do. A browser user signs in once, either
with the form that the 401 page shows or by opening any ``/ui`` URL with
``?token=TOKEN``; both store the token in an HttpOnly, SameSite=Strict cookie
scoped to ``/ui`` (and redirect to the URL without the token, which then only
stays in that first request's access log line). Scripts may send
``Authorization: Bearer TOKEN`` instead. Without the setting the pages are open.

Forms change state (the cookie), so they are accepted from this server's own pages
only: a ``POST`` whose ``Origin`` (or, without one, ``Referer``) does not name the
host it was sent to gets a 403 (no login or logout CSRF). A ``?token=`` link sets the
cookie only when the browser says it was opened directly or from this site
(``Sec-Fetch-Site: none`` or ``same-origin``; a client that sends no such header, a
script or a browser from before 2023, counts as direct). ``next`` redirects stay
inside ``/ui`` after percent-decoding and resolving ``.`` and ``..``. Setting and
deleting the cookie use the same attributes.

Bad input (a malformed or unknown workload key, an unknown figure, preset or
status, an over-long device kind) gets a 4xx whose ``message`` names the field:
a JSON ``{"detail", "message"}`` body, or an HTML page with the message when
the client asks for HTML.
"""

from __future__ import annotations

import collections
import contextlib
import posixpath
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from kernel.presets import PRESETS
from kernel.workload import KEY_RE
from server.dashboard import catalog
from server.dashboard.renderer import FigureRenderer, FigureUnavailable
from server.settings import Settings
from server.store import models, queue, records, tokens, workloads
from server.store.records import TuningRecord

COOKIE = "tiletune_token"
COOKIE_PATH = "/ui"
HOME = "/ui"
MAX_DEVICE_KIND = 64
CONFIG_ROWS = 200
JOB_ROWS = 50
TRIAL_ROWS = 200


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Stop the app's drawing processes when the server stops."""
    try:
        yield
    finally:
        renderer = getattr(app.state, "ui_renderer", None)
        if renderer is not None:
            renderer.close()


router = APIRouter(prefix="/ui", include_in_schema=False, lifespan=_lifespan)


class UIError(Exception):
    def __init__(self, status: int, message: str, login: bool = False, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.login = login
        self.headers = headers or {}


class FigureCache:
    """PNG bytes by (workload key, figure, latest trial id, tuned config id); least recently used out
    once the kept PNGs pass ``max_bytes`` (bounded by bytes: a block map of 16 head classes weighs
    ten small figures)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: collections.OrderedDict[tuple[Any, ...], bytes] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> bytes | None:
        with self._lock:
            png = self._items.get(key)
            if png is not None:
                self._items.move_to_end(key)
            return png

    def put(self, key: tuple[Any, ...], png: bytes) -> None:
        if len(png) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += len(png) - (len(old) if old is not None else 0)
            self._items[key] = png
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    @property
    def nbytes(self) -> int:
        """Bytes of the PNGs kept now (at most ``max_bytes``)."""
        return self._bytes


def _figure_cache(request: Request) -> FigureCache:
    state = request.app.state
    cache = getattr(state, "ui_figures", None)
    if cache is None:
        settings: Settings = state.settings
        cache = state.ui_figures = FigureCache(settings.figure_cache_mb << 20)
    return cache


def _renderer(request: Request) -> FigureRenderer:
    state = request.app.state
    renderer = getattr(state, "ui_renderer", None)
    if renderer is None:
        settings: Settings = state.settings
        renderer = state.ui_renderer = FigureRenderer(
            workers=settings.figure_workers,
            queue=settings.figure_queue,
            timeout_s=settings.figure_timeout_s,
            memory_mb=settings.figure_memory_mb,
            max_tiles=settings.max_figure_tiles,
        )
    return renderer


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _error_response(request: Request, exc: UIError, next_url: str | None = None) -> Response:
    """``next_url``: where the sign-in form returns to (default: the page that was asked for)."""
    headers = {**exc.headers, **({"WWW-Authenticate": "Bearer"} if exc.status == 401 else {})}
    if _wants_html(request):
        from server.dashboard import pages  # jinja loads with the first page, not at start-up

        if next_url is None:
            query = _without_token(request)
            next_url = request.url.path + (f"?{query}" if query else "")
        html = pages.render(
            "error.html",
            root=request.scope.get("root_path", ""),
            signed_in=False,
            status_code=exc.status,
            message=exc.message,
            login=exc.login,
            next_url=next_url,
        )
        response: Response = HTMLResponse(html, exc.status, headers=headers)
    else:
        response = JSONResponse({"detail": exc.message, "message": exc.message}, exc.status, headers=headers)
    if exc.status == 401 and request.cookies.get(COOKIE):
        _delete_token_cookie(request, response)  # the cookie's token was refused
    return response


def _without_token(request: Request) -> str:
    return urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])


def _bearer(request: Request) -> str | None:
    try:
        return tokens.bearer_token(request.headers.get("authorization"))
    except ValueError as exc:
        raise UIError(401, str(exc)) from None


def _cookie_attributes(request: Request) -> dict[str, Any]:
    """The one set of attributes the token cookie is set and deleted with."""
    return {"path": COOKIE_PATH, "httponly": True, "samesite": "strict", "secure": request.url.scheme == "https"}


def _set_token_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, **_cookie_attributes(request))


def _delete_token_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, **_cookie_attributes(request))


def _same_origin(request: Request) -> bool:
    """Whether a form post comes from this server's own pages: its ``Origin`` (or, when a browser
    sends none, its ``Referer``) names the host the request was sent to. A cross-site page cannot
    forge either; a post with neither (or ``Origin: null``) is refused too."""
    host = request.headers.get("host")
    source = request.headers.get("origin") or request.headers.get("referer")
    if not host or not source or source == "null":
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _check_same_origin(request: Request, action: str) -> None:
    if not _same_origin(request):
        raise UIError(
            403,
            f"origin: {action} is accepted only from this server's own pages "
            f"(the Origin or Referer header must name {request.headers.get('host', 'this host')!r})",
        )


def _inside_ui(target: str) -> str:
    """``target`` as a path inside ``/ui`` (its query kept), or ``/ui`` when it would lead anywhere
    else: another site (``//host``, ``https:``), or out of ``/ui`` once percent-escapes are decoded
    and ``.`` / ``..`` resolved as a browser does (``/ui/../..``, ``/ui/%2e%2e``)."""
    if any(c == "\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return HOME  # browsers read a backslash as '/' and drop tabs and newlines
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return HOME
    path = posixpath.normpath(unquote(parts.path))
    if path != HOME and not path.startswith(HOME + "/"):
        return HOME
    return quote(path) + (f"?{parts.query}" if parts.query else "")


def _gate(request: Request, session: Session) -> Response | None:
    """Check read access; a ``?token=`` sign-in answers with its redirect. None: go on."""
    settings: Settings = request.app.state.settings
    offered = request.query_params.get("token")
    if offered is not None:
        if request.headers.get("sec-fetch-site", "none") not in ("none", "same-origin"):
            # A link on another site would sign the browser in with that site's token.
            raise UIError(
                403,
                "token: a ?token= sign-in link works when opened directly, not from another site's page",
                login=True,
            )
        if tokens.verify_token(session, offered) is None:
            raise UIError(401, "token: unknown or revoked token", login=True)
        query = _without_token(request)
        response = RedirectResponse(request.url.path + (f"?{query}" if query else ""), 303)
        _set_token_cookie(request, response, offered)
        return response
    if not settings.require_read_token:
        return None
    token = _bearer(request) or request.cookies.get(COOKIE)
    if token is None:
        raise UIError(401, "authorization: this server needs a token for reads; sign in with one", login=True)
    if tokens.verify_token(session, token) is None:
        raise UIError(401, "authorization: unknown or revoked token", login=True)
    return None


def _signed_in(request: Request) -> bool:
    return bool(request.cookies.get(COOKIE))


def _workload(session: Session, key: str) -> models.Workload:
    if not KEY_RE.match(key):
        raise UIError(422, "workload_key: must be 32 lowercase hexadecimal characters")
    row = workloads.find_workload(session, key)
    if row is None:
        raise UIError(404, f"workload_key: no workload with key {key!r}")
    return row


def _text_filter(request: Request, name: str, limit: int) -> str | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if len(value) > limit:
        raise UIError(422, f"{name}: at most {limit} characters")
    if "\x00" in value:
        raise UIError(422, f"{name}: must not contain NUL")
    return value


def _page(request: Request, render: Any) -> Any:
    """``render(session)`` behind the read gate; a UIError becomes its error response."""
    db = request.app.state.db
    try:
        with db.read_sessions() as session:
            gate = _gate(request, session)
            if gate is not None:
                return gate
            return render(session)
    except UIError as exc:
        return _error_response(request, exc)


# ---------------------------------------------------------------- routes


@router.get("", response_class=HTMLResponse)
def dashboard(request: Request) -> Response:
    def render(session: Session) -> Response:
        from server.dashboard import pages

        device_kind = _text_filter(request, "device_kind", MAX_DEVICE_KIND)
        preset = _text_filter(request, "preset", 64)
        if preset is not None and preset not in PRESETS:
            raise UIError(422, f"preset: unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        configs, configs_truncated = _current_configs(session, device_kind, preset)
        jobs, jobs_truncated = _jobs(session)
        kinds = session.scalars(select(models.Workload.device_kind).distinct().order_by(models.Workload.device_kind))
        html = pages.render(
            "index.html",
            root=request.scope.get("root_path", ""),
            signed_in=_signed_in(request),
            filters={"device_kind": device_kind, "preset": preset},
            device_kinds=list(kinds),
            presets=list(PRESETS),
            configs=configs,
            configs_truncated=configs_truncated,
            jobs=jobs,
            jobs_truncated=jobs_truncated,
        )
        return HTMLResponse(html)

    return _page(request, render)


@router.get("/workloads/{key}", response_class=HTMLResponse)
def workload_page(request: Request, key: str) -> Response:
    def render(session: Session) -> Response:
        from server.dashboard import pages

        status = _text_filter(request, "status", 16)
        if status is not None and status not in models.TRIAL_STATUSES:
            raise UIError(422, f"status: must be one of {', '.join(models.TRIAL_STATUSES)}")
        row = _workload(session, key)
        record = TuningRecord.load(session, row)
        root = request.scope.get("root_path", "")
        version = "-".join(str(v) for v in record.version)
        src = {name: f"{root}/ui/workloads/{key}/figures/{name}.png?v={version}" for name in catalog.NAMES}
        shown = [t for t in reversed(record.trials) if status is None or t.status == status]
        html = pages.render(
            "workload.html",
            root=root,
            signed_in=_signed_in(request),
            w=pages.workload_summary(record),
            figures=pages.figure_entries(src, catalog.sizes(record)),
            trials=pages.trial_rows(shown[:TRIAL_ROWS]),
            trials_total=len(shown),
            trials_truncated=len(shown) > TRIAL_ROWS,
            interactive=True,
            statuses=models.TRIAL_STATUSES,
            status=status,
        )
        return HTMLResponse(html)

    return _page(request, render)


@router.get("/workloads/{key}/figures/{filename}", response_class=Response)
async def workload_figure(request: Request, key: str, filename: str) -> Response:
    """A figure from the cache, or drawn by a child process: the database work runs in the thread
    pool, the drawing in :mod:`server.dashboard.renderer`, and the event loop only waits."""
    name = filename.removesuffix(".png")

    def prepare(session: Session) -> Response | tuple[tuple[Any, ...], dict[str, str], TuningRecord]:
        if name == filename or name not in catalog.NAMES:
            known = ", ".join(n + ".png" for n in catalog.NAMES)
            raise UIError(404, f"figure: unknown figure {filename!r}; one of {known}")
        row = _workload(session, key)
        latest = session.scalar(select(func.max(models.Trial.id)).where(models.Trial.workload_id == row.id))
        tuned = records.current_config(session, row.id)
        version = (key, name, latest, tuned.id if tuned else None)
        etag = '"' + "-".join(str(v) for v in version) + '"'
        # private: with read auth on, shared caches must not keep a page a token unlocked.
        headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        png = _figure_cache(request).get(version)
        if png is not None:
            return Response(png, media_type="image/png", headers=headers)
        return version, headers, TuningRecord.load(session, row)

    prepared = await run_in_threadpool(_page, request, prepare)
    if isinstance(prepared, Response):
        return prepared
    version, headers, record = prepared
    try:
        png = await _renderer(request).render(record, name)
    except FigureUnavailable as exc:
        return _error_response(request, UIError(exc.status, exc.message, headers=exc.headers))
    _figure_cache(request).put(version, png)
    return Response(png, media_type="image/png", headers=headers)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Form sign-in from this server's own page: ``token`` and the ``next`` /ui URL (the body is
    small: the app bounds its size)."""
    next_url = HOME
    try:
        try:
            form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
        except ValueError:
            raise UIError(422, "body: expected a form with the fields 'token' and 'next'", login=True) from None
        next_url = _inside_ui((form.get("next") or [HOME])[0])
        _check_same_origin(request, "signing in")
        token = (form.get("token") or [""])[0].strip()
        if not token:
            raise UIError(422, "token: required", login=True)
        with request.app.state.db.read_sessions() as session:
            if tokens.verify_token(session, token) is None:
                raise UIError(401, "token: unknown or revoked token", login=True)
    except UIError as exc:
        return _error_response(request, exc, next_url)
    response = RedirectResponse(next_url, 303)
    _set_token_cookie(request, response, token)
    return response


@router.get("/logout", response_class=HTMLResponse)
def logout_page(request: Request) -> Response:
    """The sign-out button (a GET changes nothing: a link on another site cannot sign anyone out)."""
    from server.dashboard import pages

    html = pages.render("logout.html", root=request.scope.get("root_path", ""), signed_in=_signed_in(request))
    return HTMLResponse(html)


@router.post("/logout")
def logout(request: Request) -> Response:
    """Sign out (drop the cookie), from this server's own page only."""
    try:
        _check_same_origin(request, "signing out")
    except UIError as exc:
        return _error_response(request, exc)
    response = RedirectResponse(HOME, 303)
    _delete_token_cookie(request, response)
    return response


# ---------------------------------------------------------------- queries


def _current_configs(session: Session, device_kind: str | None, preset: str | None) -> tuple[list[dict], bool]:
    from server.dashboard import pages

    query = (
        select(models.TunedConfig, models.Workload)
        .join(models.Workload, models.Workload.id == models.TunedConfig.workload_id)
        .where(models.TunedConfig.is_current == True)  # noqa: E712
        .order_by(models.TunedConfig.id.desc())
    )
    if device_kind is not None:
        query = query.where(models.Workload.device_kind == device_kind)
    if preset is not None:
        ids = [w.id for w in workloads.preset_workloads(session, preset, device_kind)]
        query = query.where(models.Workload.id.in_(ids))
    rows = session.execute(query.limit(CONFIG_ROWS + 1)).all()
    out = []
    for tuned, wl in rows[:CONFIG_ROWS]:
        workload = workloads.workload_of(wl)
        out.append(
            {
                "key": wl.key,
                "device_kind": wl.device_kind,
                "backend": wl.backend,
                "dtype": wl.dtype,
                "preset": pages.preset_of(workload),
                "pattern": workload.pattern.describe(),
                "config": pages.describe_config(tuned.config),
                **pages.tuned_timing(tuned),
            }
        )
    return out, len(rows) > CONFIG_ROWS


def _jobs(session: Session) -> tuple[list[dict], bool]:
    rows = session.execute(
        select(models.Job, models.Workload.key)
        .join(models.Workload, models.Workload.id == models.Job.workload_id)
        .order_by(models.Job.id.desc())
        .limit(JOB_ROWS + 1)
    ).all()
    shown = rows[:JOB_ROWS]
    progress = queue.job_progress(session, [job.id for job, _ in shown])  # what GET /v1/jobs reports
    out = []
    for job, key in shown:
        p = progress[job.id]
        out.append(
            {
                "id": job.id,
                "key": key,
                "status": job.status,
                "trials": p.trials_done,
                "running": p.trials_running,
                "budget": job.budget,
                "best_ms": p.best_ms,
                "attempts": job.attempts,
                "workers": ", ".join(p.workers),
                "parallelism": job.parallelism,
                "requested_by": job.requested_by,
                "updated_at": job.updated_at,
            }
        )
    return out, len(rows) > JOB_ROWS
