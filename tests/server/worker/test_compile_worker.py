"""Compile workers (``tiletune worker --compile-only``): they compile the configs of queued TPU jobs
for real on this CPU machine, warm starts first, store each verdict once per compiler, and share a
job without compiling anything twice."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from kernel.heuristic import heuristic_config
from kernel.tpu_targets import libtpu_installed
from server.cli import app as cli
from server.store import compiles, models, queue, workloads
from server.store.db import Database
from tests.autotune.test_compile_pool import WORKLOAD

pytestmark = pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_compile_workers_compile_queued_tpu_jobs_warm_starts_first_never_twice(database_url: str, db: Database) -> None:
    with db.transaction() as session:
        row = workloads.workload_row(session, WORKLOAD)
        job, _ = queue.enqueue_job(session, row, budget=8)
        workload_id, job_id = row.id, job.id
    runner = CliRunner()
    argv = ["worker", "--compile-only", "--exit-when-idle", "--max-configs", "2", "--database-url", database_url]
    for _ in range(2):  # two compile workers, one after the other: the second takes the next configs
        result = runner.invoke(cli, argv)
        assert result.exit_code == 0, result.output
        assert "2 verdict(s) on 1 job(s)" in result.output
    with db.read_sessions() as session:
        rows = list(
            session.scalars(
                select(models.Trial).where(models.Trial.workload_id == workload_id).order_by(models.Trial.id)
            )
        )
        assert len(rows) == 4 and len({r.params_key for r in rows}) == 4  # nothing compiled twice
        assert all(r.status == "compiled" and r.job_id is None and r.compile_ms and r.memory for r in rows)
        assert all(r.versions["libtpu"] for r in rows) and len({r.worker for r in rows}) == 2
        heuristic = heuristic_config(WORKLOAD.pattern, "tpu", WORKLOAD.dtype)
        assert rows[0].params == heuristic.to_dict()  # the search measures it first, so it is compiled first
        assert compiles.refusal(session, workload_id, heuristic.to_dict(), rows[0].versions) is None
        # The job is the TPU workers' to claim: compiling took no lease.
        assert session.get(models.Job, job_id).status == "queued"
        assert queue.job_leases(session, job_id) == []
