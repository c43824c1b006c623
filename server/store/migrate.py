"""Run tiletune's Alembic migrations programmatically (used by the CLI and the tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import migrations
from server.store.db import make_engine, normalize_url

VERSION_TABLE = "tiletune_alembic_version"


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate looks at tiletune's ``tt_*`` tables only (Optuna's live beside them)."""
    if type_ == "table":
        return bool(name and name.startswith("tt_"))
    return True


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("version_table", VERSION_TABLE)
    cfg.attributes["database_url"] = normalize_url(url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(url: str | None = None, engine: Engine | None = None) -> str | None:
    eng = engine or make_engine(url or "sqlite://")
    try:
        with eng.connect() as conn:
            return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    finally:
        if engine is None:
            eng.dispose()
