"""What every command of the ``tiletune`` CLI shares: the database option, the consoles,
and the settings the commands read."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.compare import Speedup
    from kernel.workload import Workload
    from server.settings import Settings

# Progress, log lines and errors go to stderr (soft-wrapped: a log line stays whole in a file);
# results go to stdout, so `--json` output can be piped.
err = Console(stderr=True, soft_wrap=True)
# Off a terminal, the width a table or a progress line is rendered to (Rich's default there, 80 columns,
# would cut a config's description short in a file or a pipe).
FILE_WIDTH = 160

DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL (default: TILETUNE_DATABASE_URL or ./tiletune.db)"),
]
# The benchmarks that own a database: they empty it.
BenchDatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Run on this database (e.g. postgresql+psycopg://...). ALL ROWS OF ITS tt_* TABLES ARE DELETED "
        "before each run. Default: a new temporary SQLite file, removed afterwards.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout")]
CoreOpt = Annotated[
    int | None,
    typer.Option(
        "--core",
        min=0,
        help="CPU backends: the core the measuring child times on (default: the quietest when it starts)",
    ),
]


def checked_core(core: int | None) -> int | None:
    """``--core`` when this process may run there (the measuring child inherits the allowed cores)."""
    import os

    if core is not None and core not in os.sched_getaffinity(0):
        raise typer.BadParameter(f"--core {core}: this process may run on cores {sorted(os.sched_getaffinity(0))}")
    return core


def out() -> Console:
    """The stdout console: the terminal's width, or wide tables when piped to a file."""
    return Console() if sys.stdout.isatty() else Console(width=FILE_WIDTH)


def settings(database_url: str | None = None) -> Settings:
    """The service's settings (``TILETUNE_*``), with ``--database-url`` when given."""
    from server.settings import Settings

    return Settings(database_url=database_url) if database_url else Settings()


def database_url(given: str | None) -> str:
    """``--database-url`` if given, else the service's setting (TILETUNE_DATABASE_URL or SQLite)."""
    return settings(given).database_url


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as JSON that any parser reads: JSON has no infinity or NaN, so a figure that is not
    finite (a median of seeds most of which never reached a tied config) is printed as null."""
    print(json.dumps(finite(value), indent=2, allow_nan=False))


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; the Exit to raise (usage errors exit 2)."""
    err.print(f"[red]error:[/red] {escape(message)}")  # a message's own [brackets] are text, not markup
    return typer.Exit(code)


def speedups(
    median_ms: float | None,
    dense_ms: float | None,
    tiled_dense_ms: float | None,
    spread: Mapping[str, Speedup | None] | None = None,
    p10_p90: Mapping[str, Sequence[float]] | None = None,
) -> str:
    """A winner's speedups over its two anchors, named (both timed beside it in interleaved rounds),
    with their p10-p90 spread: from the runs where they are at hand (``spread`` by anchor name), else
    as a tuned config keeps it (``p10_p90``, its ``speedup_p10_p90``: the ratio of the medians is shown
    with it); empty when neither anchor was timed."""
    from autotune.compare import Speedup

    if not median_ms:
        return ""
    spread, p10_p90 = spread or {}, p10_p90 or {}

    def over(name: str, anchor_ms: float) -> str:
        measured, kept = spread.get(name), p10_p90.get(name)
        if measured is None and kept is not None and len(kept) == 2:
            measured = Speedup(anchor_ms / median_ms, float(kept[0]), float(kept[1]))
        return str(measured) if measured is not None else f"{anchor_ms / median_ms:.2f}x"

    parts = []
    if dense_ms:
        parts.append(f"{over('dense', dense_ms)} over jax.nn.dot_product_attention")
    if tiled_dense_ms:
        parts.append(f"{over('tiled_dense', tiled_dense_ms)} over tiled dense (these tiles, all-dense pattern)")
    return ", " + " and ".join(parts) if parts else ""


def ints(text: str | None, option: str) -> tuple[int, ...]:
    """Comma-separated positive integers of ``option``."""
    if not text:
        return ()
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} takes comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"{option} values must be >= 1")
    return values


def local_workload_or_exit(
    command: str, workload: Path | None, preset: str | None, backend: str, dtype: str | None
) -> Workload:
    """This machine's workload from ``--workload FILE`` or ``--preset`` (:func:`server.worker.tune.local_workload`),
    for ``tiletune COMMAND``: a bad file (unreadable, not JSON, a wrong field) or ``--backend tpu`` without a TPU
    is a one-line error and exit 2, before any compile, never a traceback."""
    from kernel.attention import NoTpuDeviceError
    from server.worker.tune import local_workload

    try:
        spec = json.loads(workload.read_text()) if workload else None
        return local_workload(spec, preset, backend, dtype, 1)
    except NoTpuDeviceError as exc:
        raise no_tpu_device(command, exc.platform) from None
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None


def no_tpu_device(command: str, platform: str) -> typer.Exit:
    """The one-line error of ``tiletune COMMAND --backend tpu`` on a machine without a TPU: it
    names what this machine can do for TPU (compile, judge configs) and what only a TPU can
    (run, time)."""
    from kernel.tpu_targets import TPU_EXTRA_HINT, libtpu_installed

    how = "" if libtpu_installed() else f" (after {TPU_EXTRA_HINT})"
    return fail(
        f"`tiletune {command} --backend tpu` times configs on a TPU device, and this machine has none "
        f"(JAX platform {platform!r}); here it can only compile for TPU, as a compile-only host{how}: "
        "`tiletune worker --compile-only` compiles the configs of queued TPU jobs for the TPU workers, "
        "`tiletune bench compile --preset P --generation v6e` a whole space; "
        "tune on a TPU VM, or use --backend xla (timing here) or interpret (correctness)"
    )
