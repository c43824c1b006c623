"""One local study on this machine, its results stored in the database (``tiletune tune``), and the
publication of a search's winner that it shares with the workers' finalizer."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from autotune.measure import MeasureOptions
from autotune.search import SearchOptions, SearchResult, TrialResult, run_search
from autotune.space import SearchSpace
from autotune.supervisor import Supervisor
from autotune.surrogate import Ridge, fit_prior
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.workload import Workload
from server.store import models, records, workloads
from server.store.db import Database
from server.store.migrate import upgrade

#: How long a local tune's writes wait out a database outage: each stands for a measured trial or
#: the whole search's winner, too costly to throw away for a restart.
TUNE_PATIENCE_S = 60.0
NEAREST_SEEDS = 3  # tuned configs of the closest workloads that warm-start a search
NEAREST_CANDIDATES = 16  # tuned workloads compared on each side of the sequence length


def warm_start_configs(session: Session, workload_id: int, workload: Workload) -> list[TileConfig]:
    """What the database knows that may start a search near the best: the workload's own current
    config (a re-tune), then the tuned configs of the :data:`NEAREST_SEEDS` nearest workloads of its
    device kind, backend and family, closest first, without repeats. The search measures them right
    after the kernel's heuristic, and its local steps move around whichever is fastest, so a
    heuristic far from the best is not the only start. What that saves is measured by ``tiletune bench
    search --replay ... --neighbours`` (README, "Tuning"), so far on the one pair of shipped tables of a family."""
    found: list[dict[str, Any]] = []
    current = records.current_config(session, workload_id)
    if current is not None:
        found.append(current.config)
    found += [
        tuned["config"] for tuned, *_ in workloads.nearest_k(session, workload, NEAREST_SEEDS, NEAREST_CANDIDATES)
    ]
    configs: dict[str, TileConfig] = {}
    for config in map(TileConfig.from_dict, found):
        configs.setdefault(config.key, config)
    return list(configs.values())


def family_prior(session: Session, workload: Workload) -> Ridge | None:
    """The family's model: :func:`autotune.surrogate.fit_prior` on the database's ok trials of the other
    workloads of ``workload``'s device kind, backend and family (None while it holds too few). The default
    sampler starts its model there, so what earlier tunes of the family learned steers this one from its
    first trial; ``tiletune bench search --replay ... --neighbours`` measures what that saves."""
    return fit_prior(records.family_trials(session, workload), workload.backend)


@dataclasses.dataclass
class TuneOutcome:
    workload_key: str
    result: SearchResult
    tuned_config_id: int | None
    versions: dict[str, str | None]


def tune_workload(
    workload: Workload,
    *,
    database_url: str,
    search: SearchOptions,
    measure: MeasureOptions | None = None,
    trial_timeout_s: float = 300.0,
    inject: dict[str, str] | None = None,
    job_id: int | None = None,
    on_trial: Callable[[TrialResult, SearchResult], None] | None = None,
) -> TuneOutcome:
    """Search ``workload`` on this machine, warm-started by :func:`warm_start_configs` (unless
    ``search.warm_start`` is off); store every trial as it finishes, then the best config.
    Each write rides out a database outage of up to :data:`TUNE_PATIENCE_S`."""
    upgrade(database_url)
    db = Database(database_url)
    versions = software_versions(workload.backend)
    host = socket.gethostname()
    space = SearchSpace(workload, workload.backend)
    trial_rows: dict[int, int] = {}
    try:

        def inputs(session: Session) -> tuple[int, list[TileConfig], Ridge | None]:
            workload_id = workloads.workload_row(session, workload).id
            seeds = warm_start_configs(session, workload_id, workload)
            return workload_id, seeds, family_prior(session, workload) if search.warm_start else None

        workload_id, seeds, prior = db.transact(inputs, what=f"reading {workload.key}", patience=TUNE_PATIENCE_S)
        search = dataclasses.replace(search, seed_configs=(*search.seed_configs, *seeds), prior=prior)

        def store_trial(config: TileConfig, status: str, **fields: Any) -> int:
            def store(session: Session) -> int:
                row = session.get(models.Workload, workload_id)
                assert row is not None
                trial = records.record_trial(
                    session, row, config.to_dict(), status, job_id=job_id, versions=versions, host=host, **fields
                )
                return trial.id

            return db.transact(store, what=f"storing a trial of {workload.key}", patience=TUNE_PATIENCE_S)

        def record(trial: TrialResult, result: SearchResult) -> None:
            fields = trial.measurement.trial_fields()
            trial_rows[trial.number] = store_trial(
                trial.config, trial.measurement.status, number=trial.number, **fields
            )
            if on_trial is not None:
                on_trial(trial, result)

        def record_invalid(config: TileConfig, reason: str) -> None:
            store_trial(config, "invalid", error=reason)

        with Supervisor(workload, workload.backend, measure, trial_timeout_s, inject=inject) as supervisor:
            result = run_search(space, supervisor, search, on_trial=record, on_invalid=record_invalid)
        tuned_id = None
        if result.best is not None:
            best = result.best

            def publish(session: Session) -> int | None:
                row = session.get(models.Workload, workload_id)
                assert row is not None
                best_row = session.get(models.Trial, trial_rows[best.number])
                return publish_winner(session, row, result, versions, best_row)

            tuned_id = db.transact(publish, what=f"publishing the winner of {workload.key}", patience=TUNE_PATIENCE_S)
        return TuneOutcome(workload.key, result, tuned_id, versions)
    finally:
        db.dispose()


def publish_winner(
    session: Session,
    row: models.Workload,
    result: SearchResult,
    versions: dict[str, str | None],
    trial: models.Trial | None,
) -> int | None:
    """Store the re-timed winner of ``result`` as the workload's tuned config (its id), with
    the spread of its re-timed runs; None when nothing was measured ok."""
    stats = result.best_stats
    if result.best is None or stats is None:
        return None
    tuned = records.publish_tuned_config(
        session,
        row,
        result.best.config.to_dict(),
        median_ms=stats.median_ms,
        p10_ms=stats.p10_ms,
        p90_ms=stats.p90_ms,
        dense_ms=result.dense_ms,
        tiled_dense_ms=result.anchor_ms("tiled_dense"),
        others_cores=result.others_cores,
        speedup_p10_p90=result.speedup_p10_p90(),
        versions=versions,
        trial=trial,
    )
    return tuned.id


def local_workload(
    spec: dict[str, Any] | None, preset: str | None, backend: str, dtype: str | None, batch: int
) -> Workload:
    """The workload of this machine's first device from a preset or a workload JSON object
    (the device is probed in a child process: this one must leave it to the measuring child)."""
    from autotune.device import probe_device
    from kernel.attention import resolve_backend
    from kernel.presets import get_preset

    if spec is not None and not isinstance(spec, dict):
        raise ValueError(f"a workload JSON file must hold one object (shape and pattern), got a {type(spec).__name__}")
    device = probe_device()
    backend = resolve_backend(backend, device.platform)
    if spec is not None:
        return Workload.from_dict(
            {"device_kind": device.kind, "backend": backend, "dtype": "bfloat16", "batch": 1, **spec}
        )
    assert preset is not None
    p = get_preset(preset)
    dtype = dtype or (p.dtype if backend != "xla" else "float32")
    return Workload(device.kind, backend, dtype, batch, p.head_dim, p.pattern())
