"""initial schema: workloads, trials, tuned configs, jobs, tokens

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tt_api_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_api_token")),
        sa.UniqueConstraint("name", name=op.f("uq_tt_api_token_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tt_api_token_token_hash")),
    )
    op.create_table(
        "tt_workload",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("device_kind", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("family", sa.String(length=200), nullable=False),
        sa.Column("pattern_hash", sa.String(length=64), nullable=False),
        sa.Column("kernel_version", sa.String(length=16), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_workload")),
        sa.UniqueConstraint("key", name=op.f("uq_tt_workload_key")),
    )
    with op.batch_alter_table("tt_workload", schema=None) as batch_op:
        batch_op.create_index(
            "ix_tt_workload_neighbours", ["device_kind", "backend", "family", "seq_len"], unique=False
        )

    op.create_table(
        "tt_job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=255), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("requested_by", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["tt_workload.id"], name=op.f("fk_tt_job_workload_id_tt_workload"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_job")),
    )
    with op.batch_alter_table("tt_job", schema=None) as batch_op:
        batch_op.create_index("ix_tt_job_claim", ["status", "priority", "id"], unique=False)
        batch_op.create_index(
            "uq_tt_job_active_workload",
            ["workload_id"],
            unique=True,
            postgresql_where=sa.text("status IN ('queued', 'running')"),
            sqlite_where=sa.text("status IN ('queued', 'running')"),
        )

    op.create_table(
        "tt_trial",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("number", sa.Integer(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("params_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("compile_ms", sa.Float(), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p10_ms", sa.Float(), nullable=True),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("max_error", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["tt_job.id"], name=op.f("fk_tt_trial_job_id_tt_job"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["tt_workload.id"], name=op.f("fk_tt_trial_workload_id_tt_workload"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_trial")),
    )
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.create_index("ix_tt_trial_history", ["workload_id", "id"], unique=False)
        batch_op.create_index("ix_tt_trial_job", ["job_id"], unique=False)
        batch_op.create_index("ix_tt_trial_status", ["workload_id", "status"], unique=False)

    op.create_table(
        "tt_tuned_config",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=False),
        sa.Column("p10_ms", sa.Float(), nullable=True),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("dense_ms", sa.Float(), nullable=True),
        sa.Column("jax_version", sa.String(length=32), nullable=False),
        sa.Column("jaxlib_version", sa.String(length=32), nullable=False),
        sa.Column("libtpu_version", sa.String(length=64), nullable=True),
        sa.Column("is_current", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("superseded_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["tt_trial.id"], name=op.f("fk_tt_tuned_config_trial_id_tt_trial"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["tt_workload.id"],
            name=op.f("fk_tt_tuned_config_workload_id_tt_workload"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tt_tuned_config")),
    )
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.create_index("ix_tt_tuned_config_workload", ["workload_id", "id"], unique=False)
        batch_op.create_index(
            "uq_tt_tuned_config_current",
            ["workload_id"],
            unique=True,
            postgresql_where=sa.text("is_current"),
            sqlite_where=sa.text("is_current = 1"),
        )


def downgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_tt_tuned_config_current", postgresql_where=sa.text("is_current"), sqlite_where=sa.text("is_current = 1")
        )
        batch_op.drop_index("ix_tt_tuned_config_workload")

    op.drop_table("tt_tuned_config")
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.drop_index("ix_tt_trial_status")
        batch_op.drop_index("ix_tt_trial_job")
        batch_op.drop_index("ix_tt_trial_history")

    op.drop_table("tt_trial")
    with op.batch_alter_table("tt_job", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_tt_job_active_workload",
            postgresql_where=sa.text("status IN ('queued', 'running')"),
            sqlite_where=sa.text("status IN ('queued', 'running')"),
        )
        batch_op.drop_index("ix_tt_job_claim")

    op.drop_table("tt_job")
    with op.batch_alter_table("tt_workload", schema=None) as batch_op:
        batch_op.drop_index("ix_tt_workload_neighbours")

    op.drop_table("tt_workload")
    op.drop_table("tt_api_token")
