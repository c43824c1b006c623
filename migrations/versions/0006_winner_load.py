"""tuned configs keep how busy the machine was while the winner and its anchors were timed

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

On a CPU a busy program on another core slows the compute-bound sparse kernel
more than the memory-bound dense anchor, even timed in CPU time on one core, so
a speedup over dense measured under load reads low. ``others_cores`` is what
other programs used meanwhile (autotune.host_load), stored beside the anchors so
a figure can be read with it; NULL where it was not measured (replays, older rows).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.add_column(sa.Column("others_cores", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tt_tuned_config", schema=None) as batch_op:
        batch_op.drop_column("others_cores")
