"""``tiletune presets``: the workload presets (real model shapes)."""

from __future__ import annotations

from rich.table import Table

from server.cli.common import out


def presets() -> None:
    """List the workload presets (real model shapes)."""
    from kernel.presets import PRESETS

    table = Table("preset", "frames x tokens", "text", "heads (per chip) x dim", "dtype", "pattern")
    for p in PRESETS.values():
        lay = p.layout
        text = f"{lay.text_tokens} {lay.text_position}" if lay.text_tokens else "-"
        table.add_row(
            p.name,
            f"{lay.frames} x {lay.tokens_per_frame} = {lay.video_tokens:,}",
            text,
            f"{p.heads} ({p.heads_per_chip}) x {p.head_dim}",
            p.dtype,
            p.pattern().describe().split("; ")[1],
        )
    out().print(table)
