"""``tiletune report``: one workload's tuning as an HTML file with PNG figures, to attach to a bug or a review.

The figures are :mod:`server.dashboard.figures` (the same code draws the ``/ui`` workload
page) and the page is the ``/ui`` workload page's body (:mod:`server.dashboard.pages`).
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernel.workload import KEY_RE

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from server.store.models import Workload as WorkloadRow


@dataclasses.dataclass
class ReportFiles:
    directory: Path
    index: Path
    figures: dict[str, Path]  # empty when embedded
    workload_key: str


class ReportError(ValueError):
    """Bad input (an unknown workload or preset): the message names the option."""


def choose_workload(
    session: Session,
    workload: str | None,
    preset: str | None,
    device_kind: str | None,
    say: Callable[[str], object] = print,
) -> WorkloadRow:
    """The workload row the report is about (see the module docstring for ``--preset``); ``say``
    names the other candidates when a preset matches several."""
    from kernel.presets import PRESETS
    from server.store import records, workloads

    if workload is not None:
        if not KEY_RE.match(workload):
            raise ReportError(f"--workload: {workload!r} is not a workload key (32 lowercase hex characters)")
        row = workloads.find_workload(session, workload)
        if row is None:
            raise ReportError(f"--workload: no workload with key {workload!r} in this database")
        return row
    assert preset is not None
    if preset not in PRESETS:
        raise ReportError(f"--preset: unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    rows = workloads.preset_workloads(session, preset, device_kind)
    if not rows:
        where = f" on device kind {device_kind!r}" if device_kind else ""
        raise ReportError(f"--preset: no workload of preset {preset!r}{where} in this database")
    tuned = [r for r in rows if records.current_config(session, r.id) is not None]
    chosen = (tuned or rows)[0]
    if len(rows) > 1:
        others = ", ".join(f"{r.key} ({r.device_kind}, {r.backend}, {r.dtype})" for r in rows if r is not chosen)
        say(f"{len(rows)} workloads use preset {preset!r}; reporting the newest tuned one. Others: {others}")
    return chosen


def write_report(
    database_url: str,
    out: Path | None,
    *,
    workload: str | None = None,
    preset: str | None = None,
    device_kind: str | None = None,
    embed: bool = False,
    say: Callable[[str], object] = print,
) -> ReportFiles:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from server.dashboard import figures, pages
    from server.store.db import Database
    from server.store.models import TRIAL_STATUSES
    from server.store.records import TuningRecord

    db = Database(database_url)
    try:
        with db.read_sessions() as session:
            row = choose_workload(session, workload, preset, device_kind, say)
            record = TuningRecord.load(session, row)
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
