"""trials also hold compile verdicts: a TPU config compiled or refused, keyed by compiler versions

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

Compile workers (``tiletune worker --compile-only``) compile the candidate configs of queued
TPU jobs on machines without a TPU. Each verdict is a trial of the workload with status
``compiled`` or ``uncompilable`` (``compiling`` while reserved), its compile time, the
executable's memory figures (``memory``) or the compiler's error, and its versions;
``compile_key`` (params and jax/jaxlib/libtpu versions) makes it one verdict per pair.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.add_column(sa.Column("compile_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("memory", sa.JSON(), nullable=True))
    op.create_index(
        "uq_tt_trial_compile",
        "tt_trial",
        ["workload_id", "compile_key"],
        unique=True,
        postgresql_where=sa.text("compile_key IS NOT NULL"),
        sqlite_where=sa.text("compile_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_tt_trial_compile", table_name="tt_trial")
    with op.batch_alter_table("tt_trial", schema=None) as batch_op:
        batch_op.drop_column("memory")
        batch_op.drop_column("compile_key")
