"""``tiletune bench service``: throughput and latency of the HTTP service, beside a bare FastAPI route.

One run, on one machine, measures:

- once N workloads, M trials and the tuned configs of most workloads are
  written, in turn (``--rounds`` windows each, A B C D A B C D ..., so a drift of
  the machine's background load touches all four alike):
  ``bare``, a bare FastAPI POST route returning a constant body (the floor of
  uvicorn + FastAPI + the HTTP client on this machine); ``lookup_empty``, the
  lookup requests on a second, migrated but empty database of the same kind
  (every request falls through to the heuristic; a temporary SQLite file, or a
  temporary database created beside the given PostgreSQL one and dropped
  afterwards); ``lookup``, the same requests on the seeded database (most hit
  ``tuned``, ``--miss-fraction`` go to ``nearest``); ``history``,
  ``GET /v1/workloads/{key}/history?limit=50`` on the workloads with the most
  trials;
- then, unless ``--no-abuse``, in turn again: ``lookup_quiet``, the same lookups, and
  ``lookup_abused``, the same lookups while one more client sends the worst requests the
  service's limits allow (:mod:`server.bench.abuse`: the largest bodies, the largest
  workload, its never-drawn figures); the report gives the ratio of their p99s, the
  abuse client's answers, and the peak resident memory of the server's process tree
  (its uvicorn workers and their figure-drawing children).

Both servers are real uvicorn subprocesses on 127.0.0.1 started with the same
settings (host, workers, log level; :mod:`server.bench.harness`); only ratios of
figures from the same run are meaningful on a shared machine. Seeding is
:mod:`server.bench.seeding`, the clients :mod:`server.bench.load`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from server.api.limits import max_json_structure
from server.bench import BenchError
from server.bench.abuse import AbuseClient
from server.bench.harness import HOST, HttpChild, child_env, http_server, uvicorn_command
from server.bench.load import (
    BenchRequest,
    LoadTarget,
    drive_load,
    history_requests,
    lookup_requests,
    page_labeller,
    source_label,
)
from server.bench.seeding import create_writer_token, plan_workloads, prepare_database, seed_database
from server.settings import Settings
from server.store.db import normalize_url

PHASES = ("bare", "lookup_empty", "lookup", "history", "lookup_quiet", "lookup_abused")  # the report's order
APP_TARGET = "server.app:create_app"
BARE_TARGET = "server.bench.service:bare_app"
BARE_PATH = "/bare"
BARE_BODY = {"source": "bare", "ok": True}


def bare_app() -> FastAPI:
    """The reference: one POST route returning a small constant JSON body, no middleware, no database.

    The route is an ``async def`` (run on the event loop) like ``/v1/lookup``, so
    the difference between the two is the service's own work, not a thread-pool hop. uvicorn imports it
    as ``server.bench.service:bare_app`` with ``--factory``.
    """
    app = FastAPI(title="tiletune bench: bare route", openapi_url=None, docs_url=None, redoc_url=None)

    @app.post(BARE_PATH)
    async def bare() -> dict[str, Any]:
        return BARE_BODY

    return app


@contextlib.contextmanager
def serving(target: str, *, workers: int, database_url: str, name: str) -> Iterator[HttpChild]:
    """A uvicorn server of ``target`` on a free loopback port, ready when entered, stopped on exit.

    Every server of a run gets the same uvicorn settings; only the target and port differ.
    """
    probe = _bare_ready if target == BARE_TARGET else _app_ready
    env = child_env({"TILETUNE_DATABASE_URL": database_url, "TILETUNE_REQUIRE_READ_TOKEN": "false"})
    with http_server(name, lambda port: uvicorn_command(target, port, workers), probe, env=env) as server:
        yield server


def _bare_ready(client: Any) -> bool:
    return bool(client.post(BARE_PATH, json={}).status_code == 200)


def _app_ready(client: Any) -> bool:
    return bool(client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200)


# ---------------------------------------------------------------- the bench


@dataclasses.dataclass
class ServiceBenchOptions:
    workloads: int = 1000
    trials: int = 10000
    clients: int = 8
    duration_s: float = 10.0
    warmup_s: float = 1.0
    workers: int = 1
    database_url: str | None = None  # None: a new temporary SQLite file, removed afterwards
    compare_empty: bool = True
    miss_fraction: float = 0.1
    tuned_fraction: float = 0.75
    history_limit: int = 50
    rounds: int = 3
    seed: int = 0
    abuse: bool = True

    def load(self) -> dict[str, Any]:
        """The keyword arguments of :func:`drive_load` every phase shares."""
        return {"clients": self.clients, "duration_s": self.duration_s, "warmup_s": self.warmup_s}

    def check(self) -> None:
        for name in ("workloads", "clients", "workers", "history_limit", "rounds"):
            if getattr(self, name) < 1:
                raise BenchError(f"--{name.replace('_', '-')} must be >= 1")
        if self.trials < 0:
            raise BenchError("--trials must be >= 0")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise BenchError("--duration must be > 0 and --warmup >= 0")
        for name in ("miss_fraction", "tuned_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BenchError(f"--{name.replace('_', '-')} must be in [0, 1]")


@contextlib.contextmanager
def empty_twin(url: str) -> Iterator[str]:
    """A migrated, empty database of the same kind as ``url`` for the duration of the block: a
    temporary SQLite file, or a temporary database on the same PostgreSQL server (the bench's
    role needs CREATEDB; without it, say ``--no-compare-empty``). Dropped on exit."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        with tempfile.TemporaryDirectory(prefix="tiletune-bench-empty-") as tmp:
            twin = f"sqlite:///{Path(tmp) / 'empty.db'}"
            prepare_database(twin)
            yield twin
        return
    name = f"{parsed.database}_bench_empty_{os.getpid()}"
    admin = create_engine(parsed, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        admin.dispose()
        first = str(exc).strip().splitlines()[0]
        raise BenchError(f"cannot create the empty database to compare with ({first}): use --no-compare-empty") from exc
    twin = parsed.set(database=name).render_as_string(hide_password=False)
    try:
        prepare_database(twin)
        yield twin
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _redact(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def run_service_bench(opts: ServiceBenchOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every phase and return the report (see the module docstring); servers and temp files never outlive it."""
    opts.check()
    say = progress or (lambda _msg: None)
    tmpdir: str | None = None
    if opts.database_url:
        url = normalize_url(opts.database_url)
    else:
        tmpdir = tempfile.mkdtemp(prefix="tiletune-bench-")
        url = f"sqlite:///{Path(tmpdir) / 'bench.db'}"
    try:
        say(f"planning {opts.workloads:,} workloads")
        t0 = time.perf_counter()
        plan = plan_workloads(opts.workloads, seed=opts.seed, tuned_fraction=opts.tuned_fraction)
        plan_s = time.perf_counter() - t0
        say("migrating and emptying tt_* tables")
        try:
            prepare_database(url)
        except SQLAlchemyError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BenchError(f"database {_redact(url)}: {first}") from exc
        lookups = lookup_requests(plan, miss_fraction=opts.miss_fraction, seed=opts.seed)
        phases: dict[str, dict[str, Any]] = {}
        abuse: dict[str, Any] | None = None
        say(f"seeding {opts.workloads:,} workloads and {opts.trials:,} trials")
        seeded = seed_database(url, plan, opts.trials, seed=opts.seed, progress=say)
        with contextlib.ExitStack() as stack:
            bare = stack.enter_context(serving(BARE_TARGET, workers=opts.workers, database_url=url, name="bare"))
            app = stack.enter_context(serving(APP_TARGET, workers=opts.workers, database_url=url, name="tiletune"))
            targets = [
                LoadTarget(
                    "bare", bare.base_url, [BenchRequest("POST", BARE_PATH, r.body) for r in lookups], None, bare
                )
            ]
            if opts.compare_empty:
                empty_url = stack.enter_context(empty_twin(url))
                empty = stack.enter_context(
                    serving(APP_TARGET, workers=opts.workers, database_url=empty_url, name="tiletune-empty")
                )
                targets.append(LoadTarget("lookup_empty", empty.base_url, lookups, source_label, empty))
            say(f"phases {', '.join(t.name for t in targets)}, lookup, history (in turn)")
            targets += [
                LoadTarget("lookup", app.base_url, lookups, source_label, app),
                LoadTarget(
                    "history",
                    app.base_url,
                    history_requests(seeded.history_keys, opts.history_limit),
                    page_labeller(opts.history_limit),
                    app,
                ),
            ]
            phases.update(drive_load(targets, rounds=opts.rounds, **opts.load()))
            if opts.abuse:
                say("phases lookup_quiet, lookup_abused (in turn)")
                limits = Settings(database_url=url)  # what the server reads from the same TILETUNE_* variables
                abuser = AbuseClient(app.base_url, limits, create_writer_token(url), max_json_structure(limits))
                quiet = LoadTarget("lookup_quiet", app.base_url, lookups, source_label, app)
                abused = dataclasses.replace(quiet, name="lookup_abused", companion=abuser)
                phases.update(drive_load([quiet, abused], rounds=opts.rounds, **opts.load()))
                abuse = abuser.report()
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)

    return {
        "options": {
            **dataclasses.asdict(opts),
            "database_url": _redact(url) if opts.database_url else "temporary SQLite file",
            "database": make_url(url).get_backend_name(),
            "uvicorn": f"--host {HOST} --workers {opts.workers} --log-level warning",
            "cpus": os.cpu_count(),
        },
        "seed": {"plan_s": round(plan_s, 2), **seeded.to_dict()},
        "phases": {name: phases[name] for name in PHASES if name in phases},
        "ratios": _ratios(phases),
        "abuse": abuse,
    }


def _ratios(phases: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    lookup, bare, empty = phases.get("lookup", {}), phases.get("bare", {}), phases.get("lookup_empty", {})
    return {
        "lookup_rps_over_bare_rps": ratio(lookup.get("rps"), bare.get("rps")),
        "lookup_p99_seeded_over_empty": ratio(lookup.get("p99_ms"), empty.get("p99_ms")),
        "lookup_p50_seeded_over_empty": ratio(lookup.get("p50_ms"), empty.get("p50_ms")),
        "history_p99_ms": phases.get("history", {}).get("p99_ms"),
        "lookup_p99_abused_over_quiet": ratio(
            phases.get("lookup_abused", {}).get("p99_ms"), phases.get("lookup_quiet", {}).get("p99_ms")
        ),
        "server_peak_rss_mb": max(
            (p["server_peak_rss_mb"] for p in phases.values() if p.get("server_peak_rss_mb") is not None),
            default=None,
        ),
    }


def print_service_report(report: dict[str, Any], out: Any) -> None:
    """The report as a rich table on ``out`` (a rich Console)."""
    from rich.table import Table

    o, s = report["options"], report["seed"]
    out.print(
        f"[bold]tiletune bench service[/bold] on {o['database']} ({o['database_url']}), uvicorn {o['uvicorn']}, "
        f"{o['clients']} clients, {o['duration_s']:g} s per phase ({o['rounds']} windows after seeding), "
        f"{o['cpus']} CPUs"
    )
    out.print(
        f"seeded {s['workloads']:,} workloads ({s['tuned_configs']:,} tuned), {s['trials']:,} trials in "
        f"{s['seconds']:.1f} s ({s['trials_per_s'] or 0:,} trials/s; plan {s['plan_s']:.1f} s)"
    )
    table = Table(
        "phase",
        "requests",
        "errors",
        "req/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "server CPU ms/req",
        "server RSS MB",
        "load",
        "answers",
    )
    for name, p in report["phases"].items():
        answers = ", ".join(f"{k} {v['count']:,} (p99 {v['p99_ms']:.1f})" for k, v in p.get("by_label", {}).items())
        table.add_row(
            name,
            f"{p['requests']:,}",
            str(p["errors"]),
            f"{p['rps']:,.0f}",
            f"{p['p50_ms']:.2f}" if p["p50_ms"] is not None else "-",
            f"{p['p99_ms']:.2f}" if p["p99_ms"] is not None else "-",
            f"{p['max_ms']:.1f}" if p["max_ms"] is not None else "-",
            f"{p['server_cpu_ms_per_request']:.2f}" if p["server_cpu_ms_per_request"] is not None else "-",
            f"{p['server_peak_rss_mb']:.0f}" if p["server_peak_rss_mb"] is not None else "-",
            f"{p['loadavg_1m']:.1f}" if p["loadavg_1m"] is not None else "-",
            answers,
        )
    out.print(table)
    r = report["ratios"]

    def fmt(value: float | None, unit: str = "x") -> str:
        return f"{value:.2f}{unit}" if value is not None else "-"

    out.print(
        f"lookup req/s / bare req/s: {fmt(r['lookup_rps_over_bare_rps'])}; "
        f"lookup p99 seeded / empty: {fmt(r['lookup_p99_seeded_over_empty'])}; "
        f"history p99: {fmt(r['history_p99_ms'], ' ms')}"
    )
    if report.get("abuse"):
        a = report["abuse"]
        w = a["largest_workload"]
        out.print(
            f"abuse: {a['rounds']} rounds of a {a['crowded_body_bytes']:,}-byte crowded body, a "
            f"{a['invalid_body_bytes']:,}-byte invalid body, a job and a lookup of {w['tokens']:,} tokens x "
            f"{w['heads']} heads ({w['head_classes']} classes) x batch {w['batch']}, its page and 4 new figures"
        )
        for kind, k in a["requests"].items():
            statuses = ", ".join(f"{code} x{n}" for code, n in k["statuses"].items())
            p50 = f"{k['p50_ms']:.0f}" if k["p50_ms"] is not None else "-"
            worst = f"{k['max_ms']:.0f}" if k["max_ms"] is not None else "-"
            out.print(f"  {kind}: {statuses}; p50 {p50} ms, max {worst} ms")
        out.print(
            f"lookup p99 with the abuse client / without (windows in turn): "
            f"{fmt(r['lookup_p99_abused_over_quiet'])} (target <= 2x); server peak RSS "
            f"{fmt(r['server_peak_rss_mb'], ' MB')} (target < 1000 MB; sum over its processes)"
        )
    out.print(
        "load: 1-minute load average of the machine during the phase; with more runnable work than "
        f"{o['cpus']} CPUs, latencies include waiting for a CPU"
    )
