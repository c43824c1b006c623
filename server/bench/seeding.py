"""Seeding a database for ``tiletune bench service``: realistic workloads, trials and tuned configs in bulk.

:func:`plan_workloads` draws the workloads of a run (real :class:`~kernel.workload.Workload`
keys, specs, families and pattern hashes, resembling the presets) and the lookup
bodies a client would send for them, before anything is written, so the
empty-database phase sends exactly the requests of the seeded phase.
:func:`seed_database` writes the rows in bulk (SQLAlchemy Core executemany on
SQLite, ``COPY`` on PostgreSQL), not through the store functions, so a million
trials take a minute rather than hours; the rows are the ones the store writes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import random
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from sqlalchemy import JSON, Column, Connection, MetaData, Table, Text, insert, text

from kernel.config import TileConfig, params_key
from kernel.layout import TextPosition, VideoLayout
from kernel.pattern import HeadPattern, PatternKind, SparsityPattern
from kernel.workload import Workload
from server.store import models, tokens
from server.store.db import Database
from server.store.migrate import upgrade
from server.store.workloads import workload_columns

# Versions written into the seeded tuned configs and sent with every lookup, so
# that seeded keys answer ``tuned`` (they are labels; no JAX is imported here).
BENCH_VERSIONS: dict[str, str | None] = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None}
OLD_VERSIONS: dict[str, str | None] = {"jax": "0.10.1", "jaxlib": "0.10.1", "libtpu": None}
REQUEST_POOL = 2000  # distinct lookup bodies per run (sampled from the seeded workloads)
MISS_POOL = 200  # distinct never-seeded workloads among the lookup bodies
HISTORY_POOL = 200  # workloads whose history pages are requested

# The workload space the seeded rows are drawn from: device kinds with their
# backend, text layouts of real video models, head counts per chip.
DEVICES = (("TPU v6 lite", "tpu"), ("TPU v5 lite", "tpu"), ("TPU v5p", "tpu"), ("TPU v4", "tpu"), ("cpu", "xla"))
TEXT_LAYOUTS: tuple[tuple[int, TextPosition], ...] = ((0, "suffix"), (226, "prefix"), (256, "suffix"), (77, "prefix"))
HEAD_COUNTS = (2, 4, 8, 10, 12, 16, 24, 48)
BATCHES = (1, 1, 1, 2, 4, 8)
HEAD_DIMS = (64, 128, 128)


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


def create_writer_token(url: str, name: str = "bench-abuse") -> str:
    """A writer token in the bench's database (the abuse client queues jobs with it)."""
    db = Database(url)
    try:
        with db.transaction() as session:
            return tokens.create_token(session, name, "writer")
    finally:
        db.dispose()


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
        columns = workload_columns(wl)
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
