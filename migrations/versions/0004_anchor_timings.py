"""tuned configs keep the tiled dense anchor timed beside the winner

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

A tuned config's speedup was shown against the library's dense attention only
(``dense_ms``), which is memory-bound on a CPU. The search now times the winner
in interleaved rounds beside two anchors; ``tiled_dense_ms`` is the second: the
same backend running the winner's tiles on an all-dense pattern.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tiled_dense_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.drop_column("tiled_dense_ms")
