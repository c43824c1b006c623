"""tuned configs keep the p10-p90 of their speedups over both anchors

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

A speedup is stated with its spread: the 10th and 90th percentiles of the ratios of
runs taken side by side, pooled over the measuring processes the winner and its
anchors were timed in (autotune.search.anchor_rounds). The medians alone cannot
give it back, so it is stored: ``{"dense": [p10, p90], "tiled_dense": [p10, p90]}``
(an anchor that was not timed is absent); NULL for older rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.add_column(sa.Column("speedup_p10_p90", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.drop_column("speedup_p10_p90")
