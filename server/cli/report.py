"""``tiletune report``: one workload's tuning as an HTML file with PNG figures (:mod:`server.dashboard.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from server.cli.common import DatabaseOpt, err, fail
from server.cli.common import database_url as database_url_of
from server.dashboard.report import ReportError, write_report


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
    database_url: DatabaseOpt = None,
) -> None:
    """Write an HTML report with PNG figures of one workload's tuning (trials and tuned config from the database)."""
    if (workload is None) == (preset is None):
        raise typer.BadParameter("give exactly one of --workload or --preset")
    if device_kind is not None and preset is None:
        raise typer.BadParameter("--device-kind only applies with --preset")
    url = database_url_of(database_url)
    try:
        files = write_report(
            url, out, workload=workload, preset=preset, device_kind=device_kind, embed=embed, say=err.print
        )
    except ReportError as exc:
        raise fail(str(exc)) from None
    err.print(f"report of workload {files.workload_key}:")
    print(files.index)
    for path in files.figures.values():
        print(path)
