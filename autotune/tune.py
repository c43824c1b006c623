"""``tiletune tune``: one local study on this machine, results stored in the database."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from typing import Any

from autotune.measure import MeasureOptions
from autotune.search import SearchOptions, SearchResult, TrialResult, run_search
from autotune.space import SearchSpace
from autotune.supervisor import Supervisor
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.workload import Workload


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
    """Search ``workload`` on this machine; store every trial as it finishes, then the best config."""
    from server import store
    from server.db import Database
    from server.migrate import upgrade

    upgrade(database_url)
    db = Database(database_url)
    versions = software_versions()
    host = socket.gethostname()
    space = SearchSpace(workload, workload.backend)
    trial_rows: dict[int, int] = {}
    try:
        with db.sessions() as session:
            row = store.workload_row(session, workload)

            def record(trial: TrialResult, result: SearchResult) -> None:
                stored = store.record_trial(
                    session,
                    row,
                    trial.config.to_dict(),
                    trial.measurement.status,
                    number=trial.number,
                    job_id=job_id,
                    versions=versions,
                    host=host,
                    **trial.measurement.trial_fields(),
                )
                trial_rows[trial.number] = stored.id
                if on_trial is not None:
                    on_trial(trial, result)

            def record_invalid(config: TileConfig, reason: str) -> None:
                store.record_trial(
                    session, row, config.to_dict(), "invalid", job_id=job_id, error=reason, versions=versions, host=host
                )

            with Supervisor(workload, workload.backend, measure, trial_timeout_s, inject=inject) as supervisor:
                result = run_search(space, supervisor, search, on_trial=record, on_invalid=record_invalid)
                result.dense_ms = supervisor.dense_ms()
            tuned_id = None
            if result.best is not None:
                best_row = session.get(store.models.Trial, trial_rows[result.best.number])
                tuned_id = publish_winner(session, row, result, versions, best_row)
            return TuneOutcome(row.key, result, tuned_id, versions)
    finally:
        db.dispose()


def publish_winner(
    session: Any, row: Any, result: SearchResult, versions: dict[str, str | None], trial: Any
) -> int | None:
    """Store the re-timed winner of ``result`` as the workload's tuned config (its id), with
    the spread of its re-timed runs; None when nothing was measured ok."""
    from server import store

    if result.best is None or result.best_median_ms is None:
        return None
    import numpy as np

    runs = np.asarray(result.best_runs_ms)
    tuned = store.publish_tuned_config(
        session,
        row,
        result.best.config.to_dict(),
        median_ms=result.best_median_ms,
        p10_ms=float(np.percentile(runs, 10)),
        p90_ms=float(np.percentile(runs, 90)),
        dense_ms=result.dense_ms,
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

    device = probe_device()
    backend = resolve_backend(backend, device.platform)
    device_kind = device.kind
    if spec is not None:
        from server.schemas import WorkloadSpec

        spec = {"device_kind": device_kind, "backend": backend, **spec}
        return WorkloadSpec.model_validate(spec).to_workload()
    assert preset is not None
    p = get_preset(preset)
    return Workload(
        device_kind, backend, dtype or (p.dtype if backend != "xla" else "float32"), batch, p.head_dim, p.pattern()
    )
