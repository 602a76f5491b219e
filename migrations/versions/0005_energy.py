"""energy per request: metrics.energy_j, metrics.energy_source

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07 22:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("energy_j", sa.Float(), nullable=True))
        batch.add_column(sa.Column("energy_source", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("energy_source")
        batch.drop_column("energy_j")
