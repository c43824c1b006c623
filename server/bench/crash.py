"""``tiletune bench crash``: tiletune's processes killed with SIGKILL at random points, then restarted.

Every run has a database of its own: a temporary SQLite file and, with a
PostgreSQL ``--database-url``, a scratch database created beside the given one
(named after it) and dropped afterwards. The scenarios:

- ``upgrade``: ``tiletune db upgrade`` on a fresh database, or on one populated
  under revision 0001 (alternately), killed at a random moment of its
  migrations: uniform over the time an uninterrupted upgrade of the same kind
  spent on the database, from getting to it (SQLite: opening its schema lock
  file; PostgreSQL: its first connection) until letting go of it.
- ``starts``: three ``tiletune db upgrade`` started at once on a fresh
  database, one of them killed at a random moment from the first getting to the
  database to the last exiting (uninterrupted): the others succeed.
- ``worker-trial``: a replay job of ``parallelism`` 2 or 1 (alternately); one
  worker killed at a random moment of a trial it measures; its co-worker, or a
  new worker, finishes the job. ``settle_s`` is the time from the kill to the
  job's end (the lease is ``LEASE_S``).
- ``worker-publish``: the job's finalizer killed inside its publish: on
  PostgreSQL blocked in the transaction that has finished the job (the bench
  holds the publish lock), on SQLite blocked at its first write (the bench
  holds the write lock once the finalizer is named); a new worker finishes.
- ``server``: ``tiletune serve`` killed at a random moment of its start (on a
  fresh database: while it migrates) or while a client queues jobs through it
  (alternately); restarted, every job it acknowledged is there, and a worker
  finishes them all.

After every run: the database upgrades to head and matches the models (rows
of a populated database kept); every job is ``done`` once with exactly one
tuned config from its trials; no trial is ``running``, and no trial is RUNNING
in an Optuna study. A run whose checks fail is reported with the reasons.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import secrets
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from autotune.replay import RecordedTable, bundled_table
from server.bench import BenchError
from server.bench.harness import HOST, Child, child_env, free_port, http_server, tiletune_command
from server.store import models, queue, records, tokens, workloads
from server.store.db import Database, make_engine, normalize_url
from server.store.migrate import SCHEMA_LOCK_SUFFIX, current_revision, head_revision, include_object, sqlite_file
from server.store.migrate import upgrade as upgrade_database
from server.worker.coordinator import optuna_storage

SCENARIOS = ("upgrade", "starts", "worker-trial", "worker-publish", "server")
TABLE = bundled_table("small-mixed.xla.json")
LEASE_S = 3.0  # the workers' lease: a dead worker's job moves on within it
TRIAL_TIMEOUT_S = 30.0
REPLAY_SLEEP = 0.15  # of the table's recorded time: about 0.25 s per trial
BUDGET = 8
JOB_TIMEOUT_S = 180.0
MAX_SERVER_JOBS = 30  # jobs a client queues through the server before it is killed

# Rows under revision 0001, linked by foreign keys (a "populated" database to upgrade).
POPULATED_0001 = [
    "INSERT INTO tt_workload (id, key, device_kind, backend, dtype, family, pattern_hash, kernel_version, batch,"
    " heads, head_dim, seq_len, spec, created_at) VALUES (1, 'k', 'cpu', 'xla', 'float32', 'f', 'h', '1', 1, 1, 64,"
    """ 256, '{"pattern": {"layout": {"frames": 4, "tokens_per_frame": 64}, "heads": [{"kind": "dense"}]}}',"""
    " '2026-01-01 00:00:00')",
    "INSERT INTO tt_job (id, workload_id, status, budget, priority, attempts, max_attempts, lease_owner,"
    " lease_expires_at, created_at, updated_at) VALUES (1, 1, 'running', 8, 0, 1, 3, 'w1', '2026-01-02 00:00:00',"
    " '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
    "INSERT INTO tt_trial (id, workload_id, job_id, params, params_key, status, median_ms, versions, created_at)"
    " VALUES (1, 1, 1, '{}', 'p', 'ok', 1.5, '{}', '2026-01-01 00:00:00')",
    "INSERT INTO tt_tuned_config (id, workload_id, trial_id, config, median_ms, jax_version, jaxlib_version,"
    " is_current, created_at) VALUES (1, 1, 1, '{}', 1.5, 'j', 'j', TRUE, '2026-01-01 00:00:00')",
    "INSERT INTO tt_api_token (id, name, role, token_hash, created_at) VALUES (1, 't', 'writer', 'x',"
    " '2026-01-01 00:00:00')",
]
POPULATED_ROWS = {"tt_workload": 1, "tt_job": 1, "tt_trial": 1, "tt_tuned_config": 1, "tt_api_token": 1}


@dataclasses.dataclass
class CrashBenchOptions:
    runs: int = 50  # per scenario and database
    database_url: str | None = None  # PostgreSQL: also run on scratch databases beside this one
    scenarios: tuple[str, ...] = SCENARIOS
    seed: int | None = None  # of the kill points (None: a random seed, reported)
    sqlite: bool = True  # False: the PostgreSQL runs only


@dataclasses.dataclass
class ScenarioReport:
    scenario: str
    database: str
    runs: int = 0
    killed: int = 0  # the SIGKILL found its process still running
    recovered: int = 0  # runs whose every check passed after the restart
    failures: list[str] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # where the kills landed
    figures: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # seconds, per run

    def count(self, name: str, yes: bool = True) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(yes)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in dataclasses.asdict(self).items() if k != "figures"}
        out["figures"] = {
            name: {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}
            for name, values in self.figures.items()
            if values
        }
        return out


# ---------------------------------------------------------------- databases


@contextlib.contextmanager
def scratch_database(url: str, tag: str = "scratch") -> Iterator[str]:
    """A new, empty PostgreSQL database beside the one of ``url`` (named after it, ``tag`` and a
    random suffix), dropped on exit; its URL. Needs the CREATEDB privilege."""
    base = make_url(normalize_url(url))
    if base.get_backend_name() != "postgresql":
        raise ValueError(f"a scratch database needs PostgreSQL, got {base.get_backend_name()}")
    name = f"{(base.database or 'tiletune')[:40]}_{tag[:12]}_{secrets.token_hex(4)}"  # within 63 bytes
    admin = create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


DatabaseFactory = Callable[[], contextlib.AbstractContextManager[str]]


def _databases(options: CrashBenchOptions, tmp: Path) -> list[tuple[str, DatabaseFactory]]:
    """(name, a factory of fresh databases) per database the bench runs on."""
    counter = itertools.count()

    @contextlib.contextmanager
    def sqlite() -> Iterator[str]:
        yield f"sqlite:///{tmp / f'crash-{next(counter)}.db'}"

    out: list[tuple[str, DatabaseFactory]] = [("sqlite", sqlite)] if options.sqlite else []
    if options.database_url is None and not out:
        raise ValueError("--no-sqlite leaves no database: give a PostgreSQL --database-url")
    if options.database_url is not None:
        base = options.database_url
        if make_url(normalize_url(base)).get_backend_name() != "postgresql":
            raise ValueError("--database-url must be a PostgreSQL URL (SQLite runs on temporary files anyway)")
        out.append(("postgresql", lambda: scratch_database(base, "crash")))
    return out


def _populate_0001(url: str) -> None:
    upgrade_database(url, "0001")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in POPULATED_0001:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def _migrating(child: Child, url: str) -> Callable[[], bool]:
    """Whether ``child`` has started on the database: SQLite, it holds the schema lock file open;
    PostgreSQL, a backend is connected to the database (the bench holds none then)."""
    path = sqlite_file(url)
    if path is not None:
        lock = Path(f"{path}{SCHEMA_LOCK_SUFFIX}")
        return lambda: child.has_open(lock)
    name = make_url(normalize_url(url)).database
    admin = make_url(normalize_url(url)).set(database="postgres")
    engine = create_engine(admin, poolclass=NullPool, isolation_level="AUTOCOMMIT")

    def connected() -> bool:
        with engine.connect() as conn:
            count = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"), {"name": name}
            ).scalar_one()
        return bool(count)

    return connected


# ---------------------------------------------------------------- checks


def check_schema(url: str, rows: dict[str, int] | None = None) -> list[str]:
    """Upgrade ``url`` (what every tiletune process does when it starts): it must reach head with
    the models' schema, and keep ``rows`` (table -> count) when given. The problems found."""
    try:
        upgrade_database(url)
    except Exception as exc:
        return [f"the upgrade after the kill failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"]
    problems = []
    if current_revision(url) != head_revision():
        problems.append(f"at revision {current_revision(url)} after the upgrade, not {head_revision()}")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={"include_object": include_object, "compare_type": True, "target_metadata": models.Base.metadata},
            )
            diff = compare_metadata(context, models.Base.metadata)
            counts = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in rows or {}}
    finally:
        engine.dispose()
    if diff:
        problems.append(f"the schema differs from the models: {diff[:3]}")
    if rows is not None and counts != rows:
        problems.append(f"rows {counts}, expected {rows}")
    return problems


def check_jobs(url: str, job_ids: list[int]) -> list[str]:
    """Every job done once with one tuned config from its trials; no trial running, in tt_trial
    or in an Optuna study. The problems found."""
    problems = []
    db = Database(url)
    try:
        with db.read_sessions() as session:
            for job_id in job_ids:
                job = session.get(models.Job, job_id)
                if job is None or job.status != "done":
                    problems.append(f"job {job_id} is {job and job.status} ({job and job.error}), not done")
                    continue
                tuned = session.scalar(
                    select(func.count())
                    .select_from(models.TunedConfig)
                    .join(models.Trial, models.Trial.id == models.TunedConfig.trial_id)
                    .where(models.Trial.job_id == job_id)
                )
                if tuned != 1:
                    problems.append(f"job {job_id} has {tuned} tuned configs")
                done_leases = [lease for lease in queue.job_leases(session, job_id) if lease.end_reason == "done"]
                if len(done_leases) != 1:
                    problems.append(f"job {job_id} was finished {len(done_leases)} times")
            running = session.scalar(
                select(func.count()).select_from(models.Trial).where(models.Trial.status == "running")
            )
            if running:
                problems.append(f"{running} trial(s) still running")
    finally:
        db.dispose()
    storage = optuna_storage(url)
    try:
        for study in storage.get_all_studies():
            states = [t.state for t in storage.get_all_trials(study._study_id, deepcopy=False)]
            if optuna.trial.TrialState.RUNNING in states:
                problems.append(f"Optuna study {study.study_name} has a RUNNING trial")
    finally:
        storage.remove_session()
        storage.engine.dispose()
    return problems


# ---------------------------------------------------------------- scenarios


class _Run:
    """One run of a scenario: a fresh database, the children started, the run's verdict."""

    def __init__(self, report: ScenarioReport, url: str, rng: random.Random) -> None:
        self.report = report
        self.url = url
        self.rng = rng
        self.children: list[Child] = []
        self.env = child_env({"TILETUNE_DATABASE_URL": url})

    def start(self, name: str, *args: str) -> Child:
        child = Child(name, tiletune_command(*args), env=self.env)
        self.children.append(child)
        return child

    def worker(self, name: str, *extra: str, replay_sleep: float = REPLAY_SLEEP) -> Child:
        """A replay worker named ``name`` (its leases and trials say so)."""
        args = ["worker", "--database-url", self.url, "--backend", "replay", "--replay-table", str(TABLE)]
        args += ["--replay-sleep", str(replay_sleep), "--lease", str(LEASE_S), "--trial-timeout", str(TRIAL_TIMEOUT_S)]
        return self.start(name, *args, "--poll", "0.2", "--quiet", "--name", name, *extra)

    def kill(self, child: Child) -> None:
        if child.alive():
            self.report.killed += 1
        child.kill()

    def close(self) -> None:
        for child in self.children:
            child.signal(signal.SIGTERM)
        for child in self.children:
            child.stop(grace_s=30)


def _until(predicate: Callable[[], bool], children: list[Child], timeout_s: float = 120.0) -> None:
    """Poll ``predicate`` (every millisecond or so) until it holds or every child exited."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and any(c.alive() for c in children):
        if time.monotonic() > deadline:
            raise BenchError(f"{children[0].name}: nothing happened within {timeout_s:g} s:\n{children[0].tail()}")
        time.sleep(0.001)


def _upgrade_kill_window(database: DatabaseFactory, populated: bool) -> float:
    """Seconds an uninterrupted ``tiletune db upgrade`` spends on the database: from opening it (its
    schema lock, or its first connection) until it lets go of it."""
    with database() as url:
        if populated:
            _populate_0001(url)
        child = Child("db upgrade", tiletune_command("db", "upgrade", "--database-url", url))
        try:
            migrating = _migrating(child, url)
            _until(migrating, [child])
            started = time.monotonic()
            _until(lambda: not migrating(), [child])
            window = time.monotonic() - started
            if child.wait(120) != 0:
                raise BenchError(f"an uninterrupted upgrade failed:\n{child.tail()}")
            return window
        finally:
            child.stop()


def _upgrade_run(run: _Run, populated: bool, window_s: float) -> list[str]:
    if populated:
        _populate_0001(run.url)
    child = run.start("db upgrade", "db", "upgrade", "--database-url", run.url)
    _until(_migrating(child, run.url), [child])
    time.sleep(run.rng.uniform(0, window_s))
    run.kill(child)
    run.report.count("left below head", current_revision(run.url) != head_revision())
    return check_schema(run.url, POPULATED_ROWS if populated else None)


def _start_three(url: str, start: Callable[[str], Child]) -> tuple[list[Child], Callable[[], bool]]:
    """Three ``tiletune db upgrade`` at once, and "has any of them got to the database?"."""
    starters = [start(f"starter {i}") for i in range(3)]
    checks = [_migrating(c, url) for c in starters]
    return starters, lambda: any(check() for check in checks)


def _starts_kill_window(database: DatabaseFactory) -> float:
    """Seconds from the first of three uninterrupted concurrent starters getting to the database
    until the last exits."""
    with database() as url:
        starters, any_migrating = _start_three(
            url, lambda name: Child(name, tiletune_command("db", "upgrade", "--database-url", url))
        )
        try:
            _until(any_migrating, starters)
            started = time.monotonic()
            codes = [c.wait(120) for c in starters]
            if codes != [0, 0, 0]:
                raise BenchError(f"uninterrupted concurrent starts failed: {codes}")
            return time.monotonic() - started
        finally:
            for c in starters:
                c.stop()


def _starts_run(run: _Run, window_s: float) -> list[str]:
    starters, any_migrating = _start_three(
        run.url, lambda name: run.start(name, "db", "upgrade", "--database-url", run.url)
    )
    victim = run.rng.choice(starters)
    _until(any_migrating, starters)
    time.sleep(run.rng.uniform(0, window_s))
    run.kill(victim)
    problems = []
    for child in starters:
        if child is not victim and child.wait(120) != 0:
            problems.append(f"{child.name} exited {child.returncode}: {child.tail(600)}")
    return problems + check_schema(run.url)


def _queue_replay_job(db: Database, parallelism: int, batch: int = 1) -> int:
    table = RecordedTable.load(TABLE)
    with db.transaction() as session:
        row = workloads.workload_row(session, dataclasses.replace(table.workload, batch=batch))
        job, _ = queue.enqueue_job(session, row, budget=BUDGET, parallelism=parallelism)
        return job.id


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def _job_status(db: Database, job_id: int) -> str | None:
    with db.read_sessions() as session:
        job = session.get(models.Job, job_id)
        return None if job is None else job.status


def _worker_trial_run(run: _Run, parallelism: int) -> list[str]:
    upgrade_database(run.url)
    db = Database(run.url)
    try:
        victim = run.worker("victim")
        others = [run.worker("co-worker")] if parallelism == 2 else []
        for child in (victim, *others):  # both claim from the start
            child.wait_for_output("claiming", 120)
        job_id = _queue_replay_job(db, parallelism)

        def measuring() -> bool:
            with db.read_sessions() as session:
                return any(t.worker == "victim" for t in queue.job_trials(session, job_id, ("running",)))

        _wait_for(measuring, 120, "a trial of the victim")
        time.sleep(run.rng.uniform(0, 0.25))  # a random moment of the trial (about 0.25 s)
        run.kill(victim)
        killed_at = time.monotonic()
        if not others:
            run.worker("rescuer")
        _wait_for(lambda: _job_status(db, job_id) == "done", JOB_TIMEOUT_S, f"job {job_id} done", poll_s=0.05)
        by = "co-worker" if others else "new worker"
        run.report.figures.setdefault(f"settle_s ({by})", []).append(time.monotonic() - killed_at)
        with db.read_sessions() as session:
            ends = {lease.worker: lease.end_reason for lease in queue.job_leases(session, job_id)}
    finally:
        db.dispose()
    run.close()
    problems = check_jobs(run.url, [job_id])
    if ends.get("victim") not in ("expired", "budget"):  # "budget": it had left when killed
        problems.append(f"the killed worker's lease ended {ends.get('victim')!r}")
    return problems


def _worker_publish_run(run: _Run) -> list[str]:
    upgrade_database(run.url)
    db = Database(run.url)
    job_id = _queue_replay_job(db, 1)
    try:
        with _blocking_publish(db) as blocked:
            victim = run.worker("victim")
            _wait_for(lambda: blocked(job_id), JOB_TIMEOUT_S, "the finalizer blocked in its publish", poll_s=0.002)
            time.sleep(run.rng.uniform(0, 0.2))
            run.kill(victim)
        run.report.count("killed before the job was done", _job_status(db, job_id) == "running")
        run.worker("rescuer")
        _wait_for(lambda: _job_status(db, job_id) == "done", JOB_TIMEOUT_S, f"job {job_id} done", poll_s=0.05)
    finally:
        db.dispose()
    run.close()
    return check_jobs(run.url, [job_id])


@contextlib.contextmanager
def _blocking_publish(db: Database) -> Iterator[Callable[[int], bool]]:
    """Block a finalizer inside its publish while the ``with`` body runs; yields "is it blocked now?".

    PostgreSQL: the bench holds the advisory lock that serialises publishes, and the
    finalizer's transaction, which has already finished the job, waits for it. SQLite: once
    the job has a finalizer the bench takes the write lock, and the finalizer's transaction
    waits at its first write."""
    conn = db.engine.connect()
    try:
        if db.dialect == "postgresql":
            conn.execute(select(func.pg_advisory_lock(records.PUBLISH_LOCK)))
            conn.commit()

            def blocked(_job_id: int) -> bool:
                with db.reader() as reader:
                    waiting = reader.execute(
                        text(
                            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                            " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted"
                        )
                    ).scalar_one()
                return bool(waiting)

            try:
                yield blocked
            finally:
                conn.execute(select(func.pg_advisory_unlock(records.PUBLISH_LOCK)))
                conn.commit()
            return
        holding = {"lock": False}

        def finalizing(job_id: int) -> bool:
            if holding["lock"]:
                return True
            with db.reader() as reader:
                named = reader.execute(select(models.Job.finalizer).where(models.Job.id == job_id)).scalar()
            if named is None:
                return False
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # pysqlite would not open it for a read
            holding["lock"] = True
            return True

        try:
            yield finalizing
        finally:
            if holding["lock"]:
                conn.exec_driver_sql("ROLLBACK")
    finally:
        conn.close()


def _server_run(run: _Run, during_start: bool, ready_s: float) -> list[str]:
    acknowledged: list[int] = []
    if during_start:  # a fresh database: the server migrates as it starts
        port = free_port()
        server = run.start("server", "serve", "--host", HOST, "--port", str(port), "--database-url", run.url)
        time.sleep(run.rng.uniform(0, ready_s))
        run.kill(server)
        run.report.count("killed starting, database below head", current_revision(run.url) != head_revision())
    else:
        upgrade_database(run.url)
        db = Database(run.url)
        with db.transaction() as session:
            token = tokens.create_token(session, "crash-writer", "writer")
        db.dispose()
        with _serving(run) as base_url:
            stop = threading.Event()
            client = threading.Thread(target=_queue_jobs, args=(base_url, token, acknowledged, stop), daemon=True)
            client.start()
            _wait_for(lambda: len(acknowledged) >= 1, 60, "a first job queued")
            time.sleep(run.rng.uniform(0, 1.0))
            run.kill(run.children[-1])
            stop.set()
            client.join(30)
        run.report.counts["jobs acknowledged before the kill"] = run.report.counts.get(
            "jobs acknowledged before the kill", 0
        ) + len(acknowledged)
    problems = check_schema(run.url)
    if problems:
        return problems
    with _serving(run) as base_url, httpx.Client(base_url=base_url, timeout=10) as http:
        for job_id in acknowledged:
            answer = http.get(f"/v1/jobs/{job_id}")
            if answer.status_code != 200 or answer.json()["status"] != "queued":
                problems.append(f"acknowledged job {job_id}: {answer.status_code} {answer.text[:200]}")
    if problems or not acknowledged:
        return problems
    db = Database(run.url)
    with db.read_sessions() as session:
        job_ids = list(session.scalars(select(models.Job.id)))
    db.dispose()
    worker = run.worker("after-restart", "--exit-when-idle", replay_sleep=0.0)
    if worker.wait(JOB_TIMEOUT_S) != 0:
        problems.append(f"the worker after the restart exited {worker.returncode}: {worker.tail(600)}")
    run.close()
    return problems + check_jobs(run.url, job_ids)


@contextlib.contextmanager
def _serving(run: _Run) -> Iterator[str]:
    """``tiletune serve`` on the run's database (migrating it first, as it does), until the block ends."""

    def command(port: int) -> list[str]:
        return tiletune_command("serve", "--host", HOST, "--port", str(port), "--database-url", run.url)

    def ready(client: httpx.Client) -> bool:
        return client.get("/readyz").status_code == 200

    with http_server("server", command, ready, env=run.env) as server:
        run.children.append(server)
        yield server.base_url


def _queue_jobs(base_url: str, token: str, acknowledged: list[int], stop: threading.Event) -> None:
    """Queue jobs of distinct workloads until stopped or the server is gone; their ids when answered 201."""
    workload = RecordedTable.load(TABLE).workload.canonical()
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, timeout=5, headers=headers) as http:
        for batch in range(1, MAX_SERVER_JOBS + 1):
            if stop.wait(0.05):
                return
            body = {"workload": {**workload, "batch": batch}, "budget": 3}
            try:
                answer = http.post("/v1/jobs", json=body)
            except httpx.HTTPError:
                return
            if answer.status_code == 201:
                acknowledged.append(answer.json()["id"])


def _server_ready_s(database: DatabaseFactory) -> float:
    """Seconds from starting ``tiletune serve`` on a fresh database to its first ready answer."""
    with database() as url:
        run = _Run(ScenarioReport("calibration", ""), url, random.Random(0))
        started = time.monotonic()
        try:
            with _serving(run):
                return time.monotonic() - started
        finally:
            run.close()


# ---------------------------------------------------------------- the bench


def run_crash_bench(options: CrashBenchOptions, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    unknown = [s for s in options.scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    rng = random.Random(seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    reports = []
    with tempfile.TemporaryDirectory(prefix="tiletune-bench-crash-") as tmp:
        for database_name, database in _databases(options, Path(tmp)):
            for scenario in options.scenarios:
                report = ScenarioReport(scenario, database_name)
                windows = _calibrate(scenario, database, progress, database_name)
                for i in range(options.runs):
                    progress(f"{scenario} on {database_name}: run {i + 1}/{options.runs}")
                    with database() as url:
                        run = _Run(report, url, rng)
                        try:
                            problems = _one_run(scenario, run, i, windows)
                        except Exception as exc:
                            problems = [f"{type(exc).__name__}: {str(exc)[:600]}"]
                        finally:
                            run.close()
                    report.runs += 1
                    if problems:
                        report.failures.append(f"run {i + 1}: " + "; ".join(problems))
                    else:
                        report.recovered += 1
                reports.append(report.summary())
    return {"options": {"runs": options.runs, "seed": seed, "lease_s": LEASE_S}, "scenarios": reports}


def _calibrate(
    scenario: str, database: DatabaseFactory, progress: Callable[[str], None], name: str
) -> dict[str, float]:
    """The kill windows of a scenario, measured once on this machine and database."""
    progress(f"{scenario} on {name}: measuring an uninterrupted run")
    if scenario == "upgrade":
        return {"fresh": _upgrade_kill_window(database, False), "populated": _upgrade_kill_window(database, True)}
    if scenario == "starts":
        return {"starts": _starts_kill_window(database)}
    if scenario == "server":
        return {"ready": _server_ready_s(database)}
    return {}


def _one_run(scenario: str, run: _Run, i: int, windows: dict[str, float]) -> list[str]:
    if scenario == "upgrade":
        populated = i % 2 == 1
        return _upgrade_run(run, populated, windows["populated" if populated else "fresh"])
    if scenario == "starts":
        return _starts_run(run, windows["starts"])
    if scenario == "worker-trial":
        return _worker_trial_run(run, 2 if i % 2 == 0 else 1)
    if scenario == "worker-publish":
        return _worker_publish_run(run)
    return _server_run(run, i % 2 == 0, windows["ready"])


def print_crash_report(report: dict[str, Any], out: Any) -> None:
    """The report as a rich table on ``out`` (a rich Console)."""
    from rich.table import Table

    o = report["options"]
    out.print(f"[bold]tiletune bench crash[/bold]: {o['runs']} runs per scenario and database (seed {o['seed']})")
    t = Table("scenario", "database", "runs", "killed", "recovered", "failed", "where the kills landed; figures")
    for s in report["scenarios"]:
        landed = [f"{name}: {n}" for name, n in s["counts"].items()]
        timed = [f"{name} median {v['median']:g} max {v['max']:g}" for name, v in s["figures"].items()]
        figures = "; ".join(landed + timed)
        t.add_row(s["scenario"], s["database"], str(s["runs"]), str(s["killed"]), str(s["recovered"]),
                  str(len(s["failures"])), figures)  # fmt: skip
    out.print(t)
    out.print(
        "killed: the SIGKILL found the process running; settle_s: from the kill to the job's end, finished by "
        f"a co-worker or a new worker (lease {o['lease_s']:g} s)"
    )
    for s in report["scenarios"]:
        for failure in s["failures"]:
            out.print(f"[red]{s['scenario']} on {s['database']}[/red] {failure}")
