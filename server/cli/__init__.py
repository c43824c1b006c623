"""The ``tiletune`` command line (typer): one module per command group.

=================  ====================================================
``presets``        :mod:`server.cli.presets`
``up``             :mod:`server.cli.up` (server, worker and a demo job)
``serve``          :mod:`server.cli.serve`
``worker``         :mod:`server.cli.worker`
``tune``           :mod:`server.cli.tune`
``lookup``,        :mod:`server.cli.query` (the HTTP API, or in-process)
``configs``,
``history``
``report``         :mod:`server.cli.report`
``db``             :mod:`server.cli.db`
``token``          :mod:`server.cli.tokens`
``bench``          :mod:`server.cli.bench`
=================  ====================================================
"""

from __future__ import annotations

import sys

import typer

from kernel.tpu_targets import quiet_libtpu_off_tpu
from server.cli import bench, db, presets, query, report, serve, tokens, tune, up, worker
from server.cli.common import err

app = typer.Typer(help="tiletune: autotuned tile configs for sparse video attention.", no_args_is_help=True)


@app.callback()
def startup() -> None:
    """Before any command: off a TPU host, tell libtpu so, before JAX loads it in this process or in the
    workers and compiling processes it starts (:func:`kernel.tpu_targets.quiet_libtpu_off_tpu`)."""
    quiet_libtpu_off_tpu()


app.command()(presets.presets)
app.command()(up.up)
app.command()(serve.serve)
app.command()(worker.worker)
app.command()(tune.tune)
app.command()(query.lookup)
app.command()(query.configs)
app.command()(query.history)
app.command()(report.report)
app.add_typer(db.db_app, name="db")
app.add_typer(tokens.token_app, name="token")
app.add_typer(bench.bench_app, name="bench")


def main() -> None:
    """The ``tiletune`` console script: the app, with a database it cannot reach told in one line
    (which database, and the driver's reason) rather than as a traceback of the driver's internals.
    Any other error keeps its traceback: it is a bug to report."""
    from rich.markup import escape

    from server.store.outage import describe, is_outage

    try:
        app()
    except Exception as exc:
        if not is_outage(exc):
            raise
        err.print(f"[red]error:[/red] no database connection: {escape(describe(exc))}")
        err.print("check --database-url (or TILETUNE_DATABASE_URL) and that the database is running")
        sys.exit(1)
