"""``tiletune report``: one workload's tuning as an HTML file with PNG figures, to attach to a bug or a review.

The figures are :mod:`server.figures` (the same code draws the ``/ui`` workload
page) and the page is the ``/ui`` workload page's body (:mod:`server.pages`).
The report directory holds ``index.html`` and ``history.png``, ``heatmap.png``,
``blockmap.png``, ``speedup.png`` beside it; ``--embed`` puts the PNGs inside
``index.html`` instead (one file to attach).

``--preset NAME`` picks the newest workload *in the database* whose pattern is
that preset's (at any head count, as the API's ``preset`` field builds it;
``--device-kind`` narrows it), preferring one with a tuned config. That finds
results tuned on another machine (a TPU worker) as well as this one's; the
workload of this machine (``tiletune tune --preset``'s key) is printed by
``tiletune tune`` and can be given with ``--workload KEY``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from server.models import Workload as WorkloadRow

err = Console(stderr=True)
KEY_RE = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass
class ReportFiles:
    directory: Path
    index: Path
    figures: dict[str, Path]  # empty when embedded
    workload_key: str


class ReportError(ValueError):
    """Bad input (an unknown workload or preset): the message names the option."""


def choose_workload(session: Session, workload: str | None, preset: str | None, device_kind: str | None) -> WorkloadRow:
    """The workload row the report is about (see the module docstring for ``--preset``)."""
    from kernel.presets import PRESETS
    from server import store

    if workload is not None:
        if not KEY_RE.match(workload):
            raise ReportError(f"--workload: {workload!r} is not a workload key (32 lowercase hex characters)")
        row = store.find_workload(session, workload)
        if row is None:
            raise ReportError(f"--workload: no workload with key {workload!r} in this database")
        return row
    assert preset is not None
    if preset not in PRESETS:
        raise ReportError(f"--preset: unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    rows = store.preset_workloads(session, preset, device_kind)
    if not rows:
        where = f" on device kind {device_kind!r}" if device_kind else ""
        raise ReportError(f"--preset: no workload of preset {preset!r}{where} in this database")
    tuned = [r for r in rows if store.current_config(session, r.id) is not None]
    chosen = (tuned or rows)[0]
    if len(rows) > 1:
        others = ", ".join(f"{r.key} ({r.device_kind}, {r.backend}, {r.dtype})" for r in rows if r is not chosen)
        err.print(f"{len(rows)} workloads use preset {preset!r}; reporting the newest tuned one. Others: {others}")
    return chosen


def write_report(
    database_url: str,
    out: Path | None,
    *,
    workload: str | None = None,
    preset: str | None = None,
    device_kind: str | None = None,
    embed: bool = False,
) -> ReportFiles:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from server import figures, pages
    from server.db import Database
    from server.models import TRIAL_STATUSES

    db = Database(database_url)
    try:
        with db.sessions() as session:
            row = choose_workload(session, workload, preset, device_kind)
            record = figures.TuningRecord.load(session, row)
    except (OperationalError, ProgrammingError) as exc:
        raise ReportError(
            f"--database-url: cannot read tiletune's tables at {_safe_url(database_url)} "
            f"({type(exc.orig).__name__}: {str(exc.orig).strip()[:200]}); is it migrated (tiletune db upgrade)?"
        ) from None
    finally:
        db.dispose()
    directory = out or Path(f"tiletune-report-{record.key[:12]}")
    directory.mkdir(parents=True, exist_ok=True)
    rendered = {name: figures.render(record, name) for name in figures.FIGURES}
    paths: dict[str, Path] = {}
    src: dict[str, str] = {}
    for name, fig in rendered.items():
        if embed:
            src[name] = "data:image/png;base64," + base64.b64encode(fig.png).decode()
        else:
            paths[name] = directory / f"{name}.png"
            paths[name].write_bytes(fig.png)
            src[name] = paths[name].name
    html = pages.render(
        "report.html",
        w=pages.workload_summary(record),
        figures=pages.figure_entries(src, {n: (f.width, f.height) for n, f in rendered.items()}),
        trials=pages.trial_rows(list(reversed(record.trials))),
        trials_total=len(record.trials),
        trials_truncated=False,
        interactive=False,
        statuses=TRIAL_STATUSES,
        status=None,
        generated_at=dt.datetime.now(dt.UTC),
        source=_safe_url(database_url),
    )
    index = directory / "index.html"
    index.write_text(html, encoding="utf-8")
    return ReportFiles(directory, index, paths, record.key)


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def report(
    workload: Annotated[str | None, typer.Option(help="Workload key (32 hex characters)")] = None,
    preset: Annotated[
        str | None, typer.Option(help="The newest workload in the database built from this preset's pattern")
    ] = None,
    device_kind: Annotated[str | None, typer.Option(help="With --preset: only workloads of this device kind")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Directory for index.html and the PNGs (default ./tiletune-report-KEY12)")
    ] = None,
    embed: Annotated[bool, typer.Option(help="Put the PNGs inside index.html (one file to attach)")] = False,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="SQLAlchemy URL (default: TILETUNE_DATABASE_URL or SQLite)")
    ] = None,
) -> None:
    """Write an HTML report with PNG figures of one workload's tuning (trials and tuned config from the database)."""
    from server.settings import Settings

    if (workload is None) == (preset is None):
        raise typer.BadParameter("give exactly one of --workload or --preset")
    if device_kind is not None and preset is None:
        raise typer.BadParameter("--device-kind only applies with --preset")
    url = database_url or Settings().database_url
    try:
        files = write_report(url, out, workload=workload, preset=preset, device_kind=device_kind, embed=embed)
    except ReportError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    err.print(f"report of workload {files.workload_key}:")
    print(files.index)
    for path in files.figures.values():
        print(path)
