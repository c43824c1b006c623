"""job leases for several workers per job; trials reserved before they are measured

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

- ``tt_job_lease``: one row per worker hold on a job (kept after it ends), so a
  job can be shared by ``parallelism`` workers and who held it when is on record.
  The single ``lease_owner`` / ``lease_expires_at`` of ``tt_job`` move there.
- ``tt_job``: ``parallelism``, ``finalizer`` (the worker re-timing the top
  configs), ``finished_at``.
- ``tt_trial``: ``worker``, ``finished_at``, and a unique (job_id, params_key)
  index: a job's trial is inserted as ``running`` before it is measured, so no
  two workers measure the same params.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tt_job_lease",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["tt_job.id"], name=op.f("fk_tt_job_lease_job_id_tt_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_job_lease")),
    )
    with op.batch_alter_table("tt_job_lease", schema=None) as batch_op:
        batch_op.create_index("ix_tt_job_lease_job", ["job_id", "ended_at"], unique=False)

    job = sa.table(
        "tt_job",
        sa.column("id", sa.Integer),
        sa.column("status", sa.String),
        sa.column("lease_owner", sa.String),
        sa.column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    lease = sa.table(
        "tt_job_lease",
        sa.column("job_id", sa.Integer),
        sa.column("worker", sa.String),
        sa.column("claimed_at", sa.DateTime(timezone=True)),
        sa.column("expires_at", sa.DateTime(timezone=True)),
    )
    conn = op.get_bind()
    held = conn.execute(
        sa.select(job.c.id, job.c.lease_owner, job.c.lease_expires_at, job.c.updated_at).where(
            job.c.status == "running", job.c.lease_owner.is_not(None), job.c.lease_expires_at.is_not(None)
        )
    ).all()
    for job_id, owner, expires, updated in held:
        conn.execute(
            lease.insert().values(job_id=job_id, worker=owner, claimed_at=updated or expires, expires_at=expires)
        )

    with op.batch_alter_table("tt_job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parallelism", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("finalizer", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("lease_owner")

    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
    # Trials of one job recorded twice under the old code (possible only through
    # invalid proposals) would break the new unique index: keep the first.
    trial = sa.table(
        "tt_trial", sa.column("id", sa.Integer), sa.column("job_id", sa.Integer), sa.column("params_key", sa.String)
    )
    first = (
        sa.select(sa.func.min(trial.c.id))
        .where(trial.c.job_id.is_not(None))
        .group_by(trial.c.job_id, trial.c.params_key)
    )
    conn.execute(trial.delete().where(trial.c.job_id.is_not(None), trial.c.id.not_in(first)))
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.create_index(
            "uq_tt_trial_job_params",
            ["job_id", "params_key"],
            unique=True,
            postgresql_where=sa.text("job_id IS NOT NULL"),
            sqlite_where=sa.text("job_id IS NOT NULL"),
        )


def downgrade() -> None:
    conn = op.get_bind()
    trial = sa.table("tt_trial", sa.column("status", sa.String), sa.column("error", sa.Text))
    # Revision 0002 knows no running trials: one still reserved is lost for good.
    conn.execute(
        trial.update().where(trial.c.status == "running").values(status="crashed", error="lost in a downgrade")
    )
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.drop_index("uq_tt_trial_job_params")
        batch_op.drop_column("finished_at")
        batch_op.drop_column("worker")

    with op.batch_alter_table("tt_job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_column("finished_at")
        batch_op.drop_column("finalizer")
        batch_op.drop_column("parallelism")
    job = sa.table(
        "tt_job",
        sa.column("id", sa.Integer),
        sa.column("lease_owner", sa.String),
        sa.column("lease_expires_at", sa.DateTime(timezone=True)),
    )
    lease = sa.table(
        "tt_job_lease",
        sa.column("id", sa.Integer),
        sa.column("job_id", sa.Integer),
        sa.column("worker", sa.String),
        sa.column("expires_at", sa.DateTime(timezone=True)),
        sa.column("ended_at", sa.DateTime(timezone=True)),
    )
    live = conn.execute(
        sa.select(lease.c.job_id, lease.c.worker, lease.c.expires_at)
        .where(lease.c.ended_at.is_(None))
        .order_by(lease.c.id)
    ).all()
    for job_id, worker, expires in live:  # the newest live lease of a job wins
        conn.execute(job.update().where(job.c.id == job_id).values(lease_owner=worker, lease_expires_at=expires))
    with op.batch_alter_table("tt_job_lease", schema=None) as batch_op:
        batch_op.drop_index("ix_tt_job_lease_job")
    op.drop_table("tt_job_lease")
