"""``tiletune bench service``: throughput and latency of the HTTP service, beside a bare FastAPI route.

One run, on one machine, measures:

- ``lookup_empty``: ``POST /v1/lookup`` on the migrated but empty database
  (every request falls through to the heuristic);
- then, once N workloads, M trials and the tuned configs of most workloads are
  written, in turn (``--rounds`` windows each, A B C A B C ..., so a drift of the
  machine's background load touches all three alike):
  ``bare``, a bare FastAPI POST route returning a constant body (the floor of
  uvicorn + FastAPI + the HTTP client on this machine); ``lookup``, the same
  lookup requests as ``lookup_empty`` (most hit ``tuned``, ``--miss-fraction``
  go to ``nearest``); ``history``, ``GET /v1/workloads/{key}/history?limit=50``
  on the workloads with the most trials.

Both servers are real uvicorn subprocesses on 127.0.0.1 started with the same
settings (host, workers, log level); only ratios of figures from the same run
are meaningful on a shared machine. Seeding writes rows in bulk (SQLAlchemy
Core executemany on SQLite, ``COPY`` on PostgreSQL), not through the store
functions, so a million trials take a minute rather than hours; the rows are
the ones the store would write (real :class:`~kernel.workload.Workload` keys,
specs, families and pattern hashes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
from fastapi import FastAPI
from sqlalchemy import JSON, Column, Connection, MetaData, Table, Text, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from kernel.config import TileConfig
from kernel.layout import TextPosition, VideoLayout
from kernel.pattern import HeadPattern, PatternKind, SparsityPattern
from kernel.workload import Workload
from server import models, store
from server.db import Database, normalize_url
from server.migrate import upgrade
from server.store import params_key

HOST = "127.0.0.1"
PHASES = ("bare", "lookup_empty", "lookup", "history")  # the report's order
APP_TARGET = "server.app:create_app"
BARE_TARGET = "server.bench_service:bare_app"
BARE_PATH = "/bare"
BARE_BODY = {"source": "bare", "ok": True}
# Versions written into the seeded tuned configs and sent with every lookup, so
# that seeded keys answer ``tuned`` (they are labels; no JAX is imported here).
BENCH_VERSIONS: dict[str, str | None] = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None}
OLD_VERSIONS: dict[str, str | None] = {"jax": "0.10.1", "jaxlib": "0.10.1", "libtpu": None}
REQUEST_POOL = 2000  # distinct lookup bodies per run (sampled from the seeded workloads)
MISS_POOL = 200  # distinct never-seeded workloads among the lookup bodies
HISTORY_POOL = 200  # workloads whose history pages are requested
SEQUENCE_LENGTH = 4096  # length of the cyclic request sequence the clients walk
STDERR_TAIL = 3000  # characters of a failed server's stderr shown in the error

# The workload space the seeded rows are drawn from: device kinds with their
# backend, text layouts of real video models, head counts per chip.
DEVICES = (("TPU v6 lite", "tpu"), ("TPU v5 lite", "tpu"), ("TPU v5p", "tpu"), ("TPU v4", "tpu"), ("cpu", "xla"))
TEXT_LAYOUTS: tuple[tuple[int, TextPosition], ...] = ((0, "suffix"), (226, "prefix"), (256, "suffix"), (77, "prefix"))
HEAD_COUNTS = (2, 4, 8, 10, 12, 16, 24, 48)
BATCHES = (1, 1, 1, 2, 4, 8)
HEAD_DIMS = (64, 128, 128)


class ServiceBenchError(RuntimeError):
    """A bench that cannot run (bad options, a server that does not start); the message says why."""


# ---------------------------------------------------------------- the bare route


def bare_app() -> FastAPI:
    """The reference: one POST route returning a small constant JSON body, no middleware, no database.

    The route is a plain ``def`` (run in the threadpool) like ``/v1/lookup``, so
    the difference between the two is the service's own work. uvicorn imports it
    as ``server.bench_service:bare_app`` with ``--factory``.
    """
    app = FastAPI(title="tiletune bench: bare route", openapi_url=None, docs_url=None, redoc_url=None)

    @app.post(BARE_PATH)
    def bare() -> dict[str, Any]:
        return BARE_BODY

    return app


# ---------------------------------------------------------------- workloads


@dataclasses.dataclass(frozen=True)
class WorkloadParams:
    """The few numbers a seeded workload is built from (kept instead of 100,000 Workload objects)."""

    device_kind: str
    backend: str
    dtype: str
    batch: int
    head_dim: int
    frames: int
    tokens_per_frame: int
    text_tokens: int
    text_position: TextPosition
    groups: tuple[tuple[PatternKind, int, bool, int], ...]  # (kind, window, first_frame_sink, count)

    def build(self) -> Workload:
        layout = VideoLayout(self.frames, self.tokens_per_frame, self.text_tokens, self.text_position)
        pattern = SparsityPattern.grouped(
            layout,
            [(HeadPattern(kind, window, sink), count) for kind, window, sink, count in self.groups],
        )
        return Workload(self.device_kind, self.backend, self.dtype, self.batch, self.head_dim, pattern)


def _draw_params(rng: random.Random) -> WorkloadParams:
    """A valid workload resembling the presets: a third spatial heads, the rest temporal, sometimes one dense."""
    device_kind, backend = rng.choice(DEVICES)
    dtype = "float32" if backend == "xla" else rng.choice(("bfloat16", "bfloat16", "bfloat16", "float32"))
    frames = rng.randint(1, 33)
    tokens_per_frame = rng.randint(16, 4096)
    text_tokens, text_position = rng.choice(TEXT_LAYOUTS)
    heads = rng.choice(HEAD_COUNTS)
    sink = rng.random() < 0.25
    groups: list[tuple[PatternKind, int, bool, int]] = []
    if heads >= 4 and rng.random() < 0.1:
        groups.append(("dense", 0, sink, 1))
        heads -= 1
    spatial = max(1, round(heads / 3))
    groups.append(("spatial", rng.randint(0, min(2, frames - 1)), sink, spatial))
    if heads > spatial:
        groups.append(("temporal", rng.randint(0, min(tokens_per_frame - 1, 96)), sink, heads - spatial))
    return WorkloadParams(
        device_kind,
        backend,
        dtype,
        rng.choice(BATCHES),
        rng.choice(HEAD_DIMS),
        frames,
        tokens_per_frame,
        text_tokens,
        text_position,
        tuple(groups),
    )


def _lookup_body(wl: Workload) -> bytes:
    """The request body a client would send for ``wl`` (explicit pattern, the bench's versions)."""
    return json.dumps({"workload": wl.canonical(), "versions": BENCH_VERSIONS}, separators=(",", ":")).encode()


@dataclasses.dataclass
class WorkloadPlan:
    """Which workloads a run seeds, which of them get a tuned config, and the lookup bodies it sends.

    Planned before anything is written so the empty-database phase sends exactly
    the requests the seeded phase sends.
    """

    params: list[WorkloadParams]
    keys: list[str]
    tuned: list[bool]
    hit_bodies: list[bytes]  # seeded workloads with a current tuned config: answer ``tuned``
    untuned_bodies: list[bytes]  # seeded workloads without one: ``nearest`` (or ``heuristic``)
    miss_bodies: list[bytes]  # never seeded: ``nearest`` (or ``heuristic``)


def plan_workloads(count: int, *, seed: int = 0, tuned_fraction: float = 0.75) -> WorkloadPlan:
    """``count`` distinct workloads (deterministic in ``seed``) plus a pool of unseeded ones for misses."""
    rng = random.Random(seed)
    pick = random.Random(seed + 1)
    sampled = set(pick.sample(range(count), min(count, REQUEST_POOL)))
    params: list[WorkloadParams] = []
    keys: list[str] = []
    tuned: list[bool] = []
    seen: set[str] = set()
    hit_bodies: list[bytes] = []
    untuned_bodies: list[bytes] = []
    miss_bodies: list[bytes] = []
    while len(params) < count or len(miss_bodies) < MISS_POOL:
        p = _draw_params(rng)
        wl = p.build()
        key = wl.key
        if key in seen:
            continue
        seen.add(key)
        if len(params) >= count:  # drawn after the seeded ones: never in the database
            miss_bodies.append(_lookup_body(wl))
            continue
        is_tuned = pick.random() < tuned_fraction
        if len(params) in sampled:
            (hit_bodies if is_tuned else untuned_bodies).append(_lookup_body(wl))
        params.append(p)
        keys.append(key)
        tuned.append(is_tuned)
    return WorkloadPlan(params, keys, tuned, hit_bodies, untuned_bodies, miss_bodies)


# ---------------------------------------------------------------- the database


def prepare_database(url: str) -> None:
    """Migrate to head, then empty every tt_* table (the bench owns the database it is given)."""
    upgrade(url)
    db = Database(url)
    try:
        db.empty_tables()
    finally:
        db.dispose()


@functools.cache
def _serialized_json(table: Table) -> Table:
    """``table`` with its JSON columns typed as text: rows arrive with their JSON already
    serialized (most values repeat, so each is dumped once, not once per row)."""
    columns = [
        Column(c.name, Text() if isinstance(c.type, JSON) else c.type, primary_key=c.primary_key) for c in table.columns
    ]
    return Table(table.name, MetaData(), *columns)


def _bulk_insert(conn: Connection, model: type[models.Base], rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (JSON columns as text) in one go: ``COPY`` on PostgreSQL, Core executemany elsewhere."""
    if not rows:
        return
    table = cast(Table, model.__table__)
    if conn.dialect.name != "postgresql":
        conn.execute(insert(_serialized_json(table)), rows)
        return
    columns = [c.name for c in table.columns]
    raw: Any = conn.connection.driver_connection  # the psycopg connection, inside SQLAlchemy's transaction
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row.get(c) for c in columns])


@dataclasses.dataclass
class SeedResult:
    """What :func:`seed_database` wrote, and the workloads whose history pages are worth requesting."""

    workloads: int
    trials: int
    tuned_configs: int
    superseded_configs: int
    seconds: float
    history_keys: list[str]
    history_trials_mean: float  # mean trials per requested history workload (a page holds at most --limit)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["history_keys"]
        out["trials_per_s"] = round(self.trials / self.seconds) if self.seconds > 0 else None
        out["seconds"] = round(self.seconds, 2)
        out["history_trials_mean"] = round(self.history_trials_mean, 1)
        return out


def _config_pool() -> list[dict[str, Any]]:
    """Distinct valid TileConfigs used as trial params and tuned configs."""
    pool = []
    for variant in ("naive", "split", "compact"):
        for block_q in (128, 256, 512):
            for block_kv in (128, 256, 512):
                for layout in ("frame_major", "temporal_major"):
                    pool.append(TileConfig(variant, block_q, block_kv, 0, layout).to_dict())
    return pool


TRIAL_ERRORS = {
    "failed": "XlaRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem",
    "invalid": "TileConfig.block_q (200) must be a multiple of 16 on TPU for bfloat16 (sublane tiling)",
    "timeout": "trial exceeded its 120 s budget",
}


def seed_database(
    url: str,
    plan: WorkloadPlan,
    trials: int,
    *,
    seed: int = 0,
    batch_size: int = 20000,
    progress: Callable[[str], None] | None = None,
) -> SeedResult:
    """Bulk-write the plan's workloads, ``trials`` trials and their tuned configs into an empty, migrated database.

    Ids are given explicitly (1..N) so trials and tuned configs can reference
    them without reading anything back; PostgreSQL's sequences are moved past
    them afterwards and its statistics refreshed (autovacuum would, later).
    Trials are spread unevenly, as tuning effort is: workload ``perm[floor(N u^2)]``
    for uniform ``u``, so a few workloads have thousands of trials and many none.
    """
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    n = len(plan.params)
    db = Database(url)
    try:
        with db.engine.begin() as conn:
            _seed_workloads(conn, plan, batch_size // 10, say)
        with db.engine.begin() as conn:
            counts, first_ok = _seed_trials(conn, n, trials, seed, batch_size, say)
        with db.engine.begin() as conn:
            tuned, superseded = _seed_tuned(conn, plan, first_ok, seed)
        say("refreshing statistics")
        _after_bulk_load(db)
    finally:
        db.dispose()
    top = sorted(range(n), key=lambda i: counts[i], reverse=True)[: min(HISTORY_POOL, n)]
    top = [i for i in top if counts[i] > 0] or top
    return SeedResult(
        workloads=n,
        trials=trials,
        tuned_configs=tuned,
        superseded_configs=superseded,
        seconds=time.perf_counter() - start,
        history_keys=[plan.keys[i] for i in top],
        history_trials_mean=sum(counts[i] for i in top) / len(top) if top else 0.0,
    )


def _seed_workloads(conn: Connection, plan: WorkloadPlan, batch_size: int, say: Callable[[str], None]) -> None:
    created = models.utcnow() - dt.timedelta(days=60)
    rows: list[dict[str, Any]] = []
    for i, p in enumerate(plan.params):
        wl = p.build()
        columns = store.workload_columns(wl)
        assert columns["key"] == plan.keys[i]
        rows.append({**columns, "id": i + 1, "spec": json.dumps(columns["spec"]), "created_at": created})
        if len(rows) >= batch_size:
            _bulk_insert(conn, models.Workload, rows)
            rows = []
            say(f"seeding workloads {i + 1:,}/{len(plan.params):,}")
    _bulk_insert(conn, models.Workload, rows)


def _seed_trials(
    conn: Connection, n: int, m: int, seed: int, batch_size: int, say: Callable[[str], None]
) -> tuple[list[int], list[int | None]]:
    """Trials 1..m: returns trials per workload and each workload's first ok trial id."""
    counts = [0] * n
    first_ok: list[int | None] = [None] * n
    if m == 0 or n == 0:
        return counts, first_ok
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    owner = perm[np.minimum((rng.random(m) ** 2 * n).astype(np.int64), n - 1)].tolist()
    status_draw = rng.random(m).tolist()
    config_draw = rng.integers(0, 1 << 30, m).tolist()
    median = rng.lognormal(1.0, 1.0, m).tolist()
    pool = _config_pool()
    pool_keys = [params_key(p) for p in pool]
    pool_json = [json.dumps(p) for p in pool]
    versions_json = json.dumps(BENCH_VERSIONS)
    base = models.utcnow() - dt.timedelta(days=30)
    step = dt.timedelta(seconds=30 * 86400 / max(m, 1))
    rows: list[dict[str, Any]] = []
    for j in range(m):
        w = owner[j]
        trial_id = j + 1
        u = status_draw[j]
        status = "ok" if u < 0.85 else "failed" if u < 0.93 else "invalid" if u < 0.97 else "timeout"
        c = config_draw[j] % len(pool)
        med = median[j] if status == "ok" else None
        rows.append(
            {
                "id": trial_id,
                "workload_id": w + 1,
                "job_id": None,
                "number": counts[w],
                "params": pool_json[c],
                "params_key": pool_keys[c],
                "status": status,
                "compile_ms": None if status == "invalid" else 800.0 + (c * 37) % 2000,
                "median_ms": med,
                "p10_ms": med * 0.97 if med is not None else None,
                "p90_ms": med * 1.05 if med is not None else None,
                "max_error": 3e-6 if status == "ok" else None,
                "error": TRIAL_ERRORS.get(status),
                "versions": versions_json,
                "host": f"bench-worker-{w % 8}",
                "created_at": base + step * j,
            }
        )
        counts[w] += 1
        if status == "ok" and first_ok[w] is None:
            first_ok[w] = trial_id
        if len(rows) >= batch_size:
            _bulk_insert(conn, models.Trial, rows)
            rows = []
            say(f"seeding trials {j + 1:,}/{m:,}")
    _bulk_insert(conn, models.Trial, rows)
    return counts, first_ok


def _seed_tuned(conn: Connection, plan: WorkloadPlan, first_ok: list[int | None], seed: int) -> tuple[int, int]:
    """A current config (the bench's versions) for every tuned workload; a quarter also keep a superseded one."""
    rng = random.Random(seed + 2)
    pool = _config_pool()
    now = models.utcnow()
    older = now - dt.timedelta(days=20)
    superseded: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []

    def row(i: int, versions: dict[str, str | None], is_current: bool, at: dt.datetime) -> dict[str, Any]:
        med = rng.lognormvariate(1.0, 1.0)
        return {
            "workload_id": i + 1,
            "trial_id": first_ok[i] if is_current else None,
            "config": json.dumps(rng.choice(pool)),
            "median_ms": med,
            "p10_ms": med * 0.97,
            "p90_ms": med * 1.05,
            "dense_ms": med * rng.uniform(1.5, 6.0),
            "jax_version": versions["jax"],
            "jaxlib_version": versions["jaxlib"],
            "libtpu_version": versions["libtpu"],
            "is_current": is_current,
            "created_at": at,
            "superseded_at": now if not is_current else None,
        }

    for i, is_tuned in enumerate(plan.tuned):
        if not is_tuned:
            continue
        if rng.random() < 0.25:
            superseded.append(row(i, OLD_VERSIONS, False, older))
        current.append(row(i, BENCH_VERSIONS, True, now))
    rows = superseded + current  # superseded rows get the lower ids, as they would have
    for k, r in enumerate(rows):
        r["id"] = k + 1
    _bulk_insert(conn, models.TunedConfig, rows)
    return len(current), len(superseded)


def _after_bulk_load(db: Database) -> None:
    """PostgreSQL: sequences past the explicit ids, VACUUM ANALYZE. SQLite: fold the WAL into the file.

    SQLite gets no ANALYZE: the service never runs one, so the bench measures the
    planner a real deployment has.
    """
    if db.dialect == "postgresql":
        with db.engine.begin() as conn:
            for table in ("tt_workload", "tt_trial", "tt_tuned_config"):
                conn.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"COALESCE((SELECT max(id) FROM {table}), 1), (SELECT max(id) FROM {table}) IS NOT NULL)"
                    )
                )
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE tt_workload, tt_trial, tt_tuned_config"))
    else:
        with db.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


# ---------------------------------------------------------------- servers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _proc_cpu_seconds(root: int) -> float | None:
    """CPU seconds (user + system) of process ``root`` and its descendants, from /proc; None elsewhere."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        parents: dict[int, int] = {}
        cpu: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = int(fields[11]) + int(fields[12])
    except (OSError, ValueError, AttributeError):
        return None
    if root not in cpu:
        return None
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu[pid] for pid in tree) / tick


class UvicornServer:
    """``python -m uvicorn TARGET --factory`` on 127.0.0.1 in its own process group, stopped on exit."""

    def __init__(self, target: str, *, workers: int, env: dict[str, str], name: str) -> None:
        self.target = target
        self.workers = workers
        self.env = env
        self.name = name
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        """The same uvicorn settings for every server of a run: only the target and port differ."""
        return [
            sys.executable,
            "-m",
            "uvicorn",
            self.target,
            "--factory",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--log-level",
            "warning",
        ]

    def start(self, probe: Callable[[httpx.Client], bool], timeout_s: float = 60.0) -> None:
        """Start on a free port and wait until ``probe`` succeeds; retry a port lost to a race."""
        for attempt in range(3):
            self.port = _free_port()
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server; closed in stop()
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                start_new_session=True,
            )
            if self._wait_ready(probe, timeout_s):
                return
            tail = self.stderr_tail()
            self.stop()
            if "address already in use" in tail.lower() and attempt < 2:
                continue
            if "address already in use" in tail.lower():
                raise ServiceBenchError(f"{self.name} server: port {self.port} on {HOST} is in use\n{tail}")
            raise ServiceBenchError(
                f"{self.name} server ({' '.join(self.command()[2:])}) did not become ready "
                f"within {timeout_s:.0f} s; its stderr ends with:\n{tail or '(empty)'}"
            )

    def _wait_ready(self, probe: Callable[[httpx.Client], bool], timeout_s: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if probe(client):
                        return True
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
        return False

    def stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - STDERR_TAIL))
        return str(self._stderr.read().decode(errors="replace")).strip()

    def cpu_seconds(self) -> float | None:
        return _proc_cpu_seconds(self.proc.pid) if self.proc else None

    def stop(self) -> None:
        """SIGTERM to the server's process group (uvicorn shuts down gracefully), SIGKILL after 10 s."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None and proc.poll() is None:  # pragma: no cover - only if the kill failed
            proc.kill()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> UvicornServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _server_env(database_url: str) -> dict[str, str]:
    """The caller's environment, the bench database, open reads, and this source tree importable."""
    env = dict(os.environ)
    env["TILETUNE_DATABASE_URL"] = database_url
    env["TILETUNE_REQUIRE_READ_TOKEN"] = "false"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.contextmanager
def serving(target: str, *, workers: int, database_url: str, name: str) -> Iterator[UvicornServer]:
    """A uvicorn server of ``target`` on a free loopback port, ready when entered, stopped on exit."""
    server = UvicornServer(target, workers=workers, env=_server_env(database_url), name=name)
    try:
        if target == BARE_TARGET:
            server.start(lambda c: c.post(BARE_PATH, json={}).status_code == 200)
        else:
            server.start(lambda c: c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200)
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- load


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    method: str
    path: str
    body: bytes | None = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in [0, 1])."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))]


def _latency_summary(latencies: list[float]) -> dict[str, Any]:
    values = sorted(latencies)
    ms = 1000.0
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 0.50) * ms, 3) if values else None,
        "p90_ms": round(percentile(values, 0.90) * ms, 3) if values else None,
        "p99_ms": round(percentile(values, 0.99) * ms, 3) if values else None,
        "max_ms": round(values[-1] * ms, 3) if values else None,
        "mean_ms": round(sum(values) / len(values) * ms, 3) if values else None,
    }


Labeller = Callable[[httpx.Response], str]


def _source_label(response: httpx.Response) -> str:
    return str(response.json().get("source", "?"))


def _page_labeller(limit: int) -> Labeller:
    """History answers are labelled ``full`` (``limit`` items) or ``partial``."""

    def label(response: httpx.Response) -> str:
        return "full" if len(response.json().get("items", ())) >= limit else "partial"

    return label


@dataclasses.dataclass(frozen=True)
class LoadTarget:
    """One phase's load: where it goes, what it sends, how answers are labelled, whose CPU is counted."""

    name: str
    base_url: str
    requests: Sequence[BenchRequest]
    labeller: Labeller | None = None
    server: UvicornServer | None = None


@dataclasses.dataclass
class _Window:
    """Raw figures of one measured window."""

    latencies: list[float]
    labels: list[str]
    errors: int
    samples: list[str]
    duration_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    loadavg: float | None


def _measure(target: LoadTarget, *, clients: int, duration_s: float, warmup_s: float) -> _Window:
    """``clients`` threads, one keep-alive ``httpx.Client`` each, walk the target's requests cyclically
    (from spread-out offsets) for ``warmup_s`` unmeasured then ``duration_s`` measured seconds.

    A request counts when it starts inside the measured window; its latency is
    ``perf_counter`` around the call, body read included. Errors are non-2xx
    answers and transport exceptions.
    """
    requests = target.requests
    if not requests:
        raise ServiceBenchError(f"{target.name}: no requests to send")
    window: dict[str, float] = {}
    barrier = threading.Barrier(clients + 1)
    results: list[dict[str, Any]] = [{} for _ in range(clients)]
    headers = {"content-type": "application/json", "accept": "application/json"}

    def client_loop(idx: int) -> None:
        latencies: list[float] = []
        labels: list[str] = []
        errors = 0
        samples: list[str] = []
        j = idx * len(requests) // clients
        with httpx.Client(base_url=target.base_url, timeout=30.0, headers=headers) as client:
            barrier.wait()
            start, end = window["start"], window["end"]
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                req = requests[j % len(requests)]
                j += 1
                label = ""
                ok = False
                try:
                    response = client.request(req.method, req.path, content=req.body)
                    ok = 200 <= response.status_code < 300
                    if ok and target.labeller is not None:
                        label = target.labeller(response)
                    elif not ok and len(samples) < 5:
                        samples.append(f"{req.method} {req.path}: {response.status_code} {response.text[:200]}")
                except (httpx.HTTPError, ValueError) as exc:
                    if len(samples) < 5:
                        samples.append(f"{req.method} {req.path}: {type(exc).__name__}: {exc}")
                t1 = time.perf_counter()
                if t0 < start:
                    continue
                if ok:
                    latencies.append(t1 - t0)
                    labels.append(label)
                else:
                    errors += 1
        results[idx] = {"latencies": latencies, "labels": labels, "errors": errors, "samples": samples}

    threads = [threading.Thread(target=client_loop, args=(i,), name=f"bench-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    window["start"] = begin + warmup_s
    window["end"] = begin + warmup_s + duration_s
    barrier.wait()
    server = target.server
    time.sleep(max(0.0, window["start"] - time.perf_counter()))
    cpu0, server0 = time.process_time(), server.cpu_seconds() if server else None
    time.sleep(max(0.0, window["end"] - time.perf_counter()))
    cpu1, server1 = time.process_time(), server.cpu_seconds() if server else None
    for t in threads:
        t.join()
    return _Window(
        latencies=[x for r in results for x in r["latencies"]],
        labels=[x for r in results for x in r["labels"]],
        errors=sum(r["errors"] for r in results),
        samples=[x for r in results for x in r["samples"]][:5],
        duration_s=duration_s,
        client_cpu_s=cpu1 - cpu0,
        server_cpu_s=server1 - server0 if server0 is not None and server1 is not None else None,
        loadavg=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )


def _summarize(target: LoadTarget, windows: list[_Window]) -> dict[str, Any]:
    """One phase's report from its windows: throughput, latency percentiles, CPU use, per-label breakdown.

    CPU time of this process (the clients) and of the server's process tree, and
    the 1-minute load average, tell whether the clients or other work on the
    machine limited the figures.
    """
    latencies = [x for w in windows for x in w.latencies]
    labels = [x for w in windows for x in w.labels]
    errors = sum(w.errors for w in windows)
    duration = sum(w.duration_s for w in windows)
    done = len(latencies) + errors
    server_cpu = [w.server_cpu_s for w in windows]
    loads = [w.loadavg for w in windows if w.loadavg is not None]
    out: dict[str, Any] = {
        "requests": done,
        "errors": errors,
        "duration_s": round(duration, 3),
        "windows": len(windows),
        "rps": round(len(latencies) / duration, 1),
        **_latency_summary(latencies),
        "client_cpu_fraction": round(sum(w.client_cpu_s for w in windows) / duration, 2),
        "server_cpu_fraction": None,
        "server_cpu_ms_per_request": None,
        "loadavg_1m": round(sum(loads) / len(loads), 2) if loads else None,
        "error_samples": [x for w in windows for x in w.samples][:5],
    }
    if server_cpu and all(c is not None for c in server_cpu):
        total = sum(c for c in server_cpu if c is not None)
        out["server_cpu_fraction"] = round(total / duration, 2)
        if done:
            out["server_cpu_ms_per_request"] = round(total * 1000 / done, 3)
    if target.labeller is not None:
        by_label: dict[str, list[float]] = {}
        for latency, label in zip(latencies, labels, strict=True):
            by_label.setdefault(label, []).append(latency)
        out["by_label"] = {k: _latency_summary(v) for k, v in sorted(by_label.items())}
    return out


def drive_load(
    targets: Sequence[LoadTarget], *, clients: int, duration_s: float, warmup_s: float = 1.0, rounds: int = 1
) -> dict[str, dict[str, Any]]:
    """Give every target ``duration_s`` measured seconds, in ``rounds`` windows taken in turn
    (A B C A B C ...), so that a change of the machine's background load during the
    run touches every phase alike. The first window of each target is preceded by
    ``warmup_s`` unmeasured seconds, later ones by a short re-warm of fresh connections.
    """
    windows: dict[str, list[_Window]] = {t.name: [] for t in targets}
    for r in range(rounds):
        for target in targets:
            warm = warmup_s if r == 0 else min(warmup_s, 0.25)
            windows[target.name].append(
                _measure(target, clients=clients, duration_s=duration_s / rounds, warmup_s=warm)
            )
    return {t.name: _summarize(t, windows[t.name]) for t in targets}


def lookup_requests(plan: WorkloadPlan, *, miss_fraction: float, seed: int = 0) -> list[BenchRequest]:
    """The cyclic lookup sequence: seeded tuned keys, and ``miss_fraction`` misses
    (alternately never-seeded workloads and seeded ones without a tuned config)."""
    rng = random.Random(seed + 3)
    misses = [plan.miss_bodies, plan.untuned_bodies]
    misses = [m for m in misses if m]
    if not plan.hit_bodies and not misses:
        raise ServiceBenchError("no lookup bodies: seed at least one workload")
    out: list[BenchRequest] = []
    for j in range(SEQUENCE_LENGTH):
        if plan.hit_bodies and (rng.random() >= miss_fraction or not misses):
            body = rng.choice(plan.hit_bodies)
        else:
            body = rng.choice(misses[j % len(misses)])
        out.append(BenchRequest("POST", "/v1/lookup", body))
    return out


def history_requests(keys: Sequence[str], limit: int) -> list[BenchRequest]:
    return [BenchRequest("GET", f"/v1/workloads/{key}/history?limit={limit}") for key in keys]


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

    def load(self) -> dict[str, Any]:
        """The keyword arguments of :func:`drive_load` every phase shares."""
        return {"clients": self.clients, "duration_s": self.duration_s, "warmup_s": self.warmup_s}

    def check(self) -> None:
        for name in ("workloads", "clients", "workers", "history_limit", "rounds"):
            if getattr(self, name) < 1:
                raise ServiceBenchError(f"--{name.replace('_', '-')} must be >= 1")
        if self.trials < 0:
            raise ServiceBenchError("--trials must be >= 0")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ServiceBenchError("--duration must be > 0 and --warmup >= 0")
        for name in ("miss_fraction", "tuned_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ServiceBenchError(f"--{name.replace('_', '-')} must be in [0, 1]")


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
            raise ServiceBenchError(f"database {_redact(url)}: {first}") from exc
        lookups = lookup_requests(plan, miss_fraction=opts.miss_fraction, seed=opts.seed)
        phases: dict[str, dict[str, Any]] = {}
        if opts.compare_empty:
            say("phase lookup_empty: lookups on the empty database")
            with serving(APP_TARGET, workers=opts.workers, database_url=url, name="tiletune") as app:
                empty = LoadTarget("lookup_empty", app.base_url, lookups, _source_label, app)
                phases.update(drive_load([empty], **opts.load()))
        say(f"seeding {opts.workloads:,} workloads and {opts.trials:,} trials")
        seeded = seed_database(url, plan, opts.trials, seed=opts.seed, progress=say)
        say("phases bare, lookup, history (in turn)")
        with (
            serving(BARE_TARGET, workers=opts.workers, database_url=url, name="bare") as bare,
            serving(APP_TARGET, workers=opts.workers, database_url=url, name="tiletune") as app,
        ):
            targets = [
                LoadTarget(
                    "bare", bare.base_url, [BenchRequest("POST", BARE_PATH, r.body) for r in lookups], None, bare
                ),
                LoadTarget("lookup", app.base_url, lookups, _source_label, app),
                LoadTarget(
                    "history",
                    app.base_url,
                    history_requests(seeded.history_keys, opts.history_limit),
                    _page_labeller(opts.history_limit),
                    app,
                ),
            ]
            phases.update(drive_load(targets, rounds=opts.rounds, **opts.load()))
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
    }
