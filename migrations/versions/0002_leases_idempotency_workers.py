"""leases on items, idempotency keys on jobs, worker presence

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 11:20:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=255), nullable=True))
        batch_op.add_column(
            sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_index(
            "ix_items_status_lease_expires_at", ["status", "lease_expires_at"], unique=False
        )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("submission_hash", sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_jobs_idempotency_key"), ["idempotency_key"]
        )
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("workers")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_jobs_idempotency_key"), type_="unique")
        batch_op.drop_column("submission_hash")
        batch_op.drop_column("idempotency_key")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index("ix_items_status_lease_expires_at")
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("lease_owner")
