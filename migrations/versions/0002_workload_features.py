"""workload features as columns for the nearest-neighbour lookup

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = ("frames", "tokens_per_frame", "text_tokens", "mean_window")


def upgrade() -> None:
    with op.batch_alter_table("tt_workload", schema=None) as batch_op:
        batch_op.add_column(sa.Column("frames", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("tokens_per_frame", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("text_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("mean_window", sa.Float(), nullable=True))
    # Backfill from the stored canonical spec (same arithmetic as Workload.features).
    conn = op.get_bind()
    workload = sa.table(
        "tt_workload", sa.column("id", sa.Integer), sa.column("spec", sa.JSON), *(sa.column(c) for c in COLUMNS)
    )
    rows = conn.execute(sa.select(workload.c.id, workload.c.spec)).all()
    for row_id, spec in rows:
        spec = json.loads(spec) if isinstance(spec, str) else spec
        layout = spec["pattern"]["layout"]
        heads = spec["pattern"]["heads"]
        windows = [h.get("window_frames", h.get("window_positions", h.get("tokens", 0))) for h in heads]
        conn.execute(
            workload.update()
            .where(workload.c.id == row_id)
            .values(
                frames=layout["frames"],
                tokens_per_frame=layout["tokens_per_frame"],
                text_tokens=layout.get("text_tokens", 0),
                mean_window=sum(windows) / len(windows),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("tt_workload", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
