"""``tiletune bench compile``: compile a preset's TPU search space for one generation, here, without a TPU.

Every config of the space that the non-memory rules admit (tiling, padding), or a sample
of them, is compiled for real through libtpu's compile-only targets
(:func:`autotune.compile_gate.compile_gate`), whether or not the VMEM/SMEM estimates of
:mod:`kernel.budget` admit it: the point is to see where the estimates and the compiler
disagree. A sample takes half its configs from those the estimates reject (the boundary
is where they can be wrong) and half from those they admit. The report gives the compile
seconds of every config, the failures by cause, and the disagreements in both directions:
estimated to fit but refused by the compiler (a search would waste a trial), and
estimated not to fit but compiled (a search never tries it).

A compile that fits says nothing of speed: timing needs the TPU.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from typing import Any

from autotune.compile_gate import compile_gate
from autotune.space import SearchSpace
from autotune.versions import software_versions
from kernel.candidates import tpu_violation
from kernel.config import TileConfig
from kernel.presets import get_preset
from kernel.tpu_targets import require_libtpu, tpu_target
from kernel.workload import Workload

MEMORY_REASONS = ("vmem", "smem")


@dataclasses.dataclass(frozen=True)
class CompileBenchOptions:
    preset: str
    generation: str
    sample: int | None = None  # configs to compile (None: every one)
    seed: int = 0
    max_seconds: float | None = None  # stop starting compiles after this long


def space_configs(workload: Workload) -> list[TileConfig]:
    """The configs of the workload's TPU space that only the memory estimates may reject."""
    space = SearchSpace(workload, "tpu")
    out = []
    for config in space.candidates():
        reason = space.violation(config)
        if reason is None or reason.startswith(MEMORY_REASONS):
            out.append(config)
    return out


def pick(configs: list[TileConfig], rejected: set[str], sample: int | None, seed: int) -> list[TileConfig]:
    """``sample`` configs, half of them (as far as there are) among the estimate-rejected."""
    if sample is None or sample >= len(configs):
        return list(configs)
    rng = random.Random(seed)
    out_of = [c for c in configs if c.key in rejected]
    inside = [c for c in configs if c.key not in rejected]
    take_out = min(len(out_of), sample // 2)
    take_in = min(len(inside), sample - take_out)
    take_out = min(len(out_of), sample - take_in)
    return rng.sample(out_of, take_out) + rng.sample(inside, take_in)


def bench_compile(opts: CompileBenchOptions, progress: Any = None) -> dict[str, Any]:
    """Compile the space (or a sample) of ``opts.preset`` for ``opts.generation``; the report."""
    require_libtpu()
    target = tpu_target(opts.generation)
    preset = get_preset(opts.preset)
    workload = Workload(target.device_kind, "tpu", preset.dtype, 1, preset.head_dim, preset.pattern())
    configs = space_configs(workload)
    estimates = {c.key: tpu_violation(workload, c) for c in configs}
    rejected = {k for k, reason in estimates.items() if reason is not None}
    chosen = pick(configs, rejected, opts.sample, opts.seed)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for i, config in enumerate(chosen):
        if opts.max_seconds is not None and time.perf_counter() - start > opts.max_seconds:
            break
        if progress:
            progress(f"{target.generation}: compiling {i + 1}/{len(chosen)} {config.describe()}")
        verdict = compile_gate(workload, config, target.device_kind)
        outcome = verdict.outcome
        rows.append(
            {
                "config": config.to_dict(),
                "describe": config.describe(),
                "estimate": verdict.estimate,
                "ok": outcome.ok,
                "cause": outcome.cause,
                "error": outcome.error,
                "compile_s": outcome.compile_s,
                "memory": outcome.memory,
                "agree": verdict.agree,
            }
        )
    times = [r["compile_s"] for r in rows if r["ok"]]
    causes: dict[str, int] = {}
    for r in rows:
        if not r["ok"]:
            causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    return {
        "preset": opts.preset,
        "generation": target.generation,
        "device_kind": target.device_kind,
        "dtype": preset.dtype,
        "versions": software_versions("tpu"),
        "space": len(configs),
        "estimated_to_fit": len(configs) - len(rejected),
        "compiled": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "failures_by_cause": causes,
        "compile_s": {
            "median": statistics.median(times) if times else None,
            "max": max(times) if times else None,
            "total": sum(r["compile_s"] for r in rows),
        },
        "disagreements": [r for r in rows if not r["agree"]],
        "configs": rows,
    }


def agreement_markdown(reports: list[dict[str, Any]]) -> str:
    """One markdown table of where the estimates and the compiler disagree, over several reports."""
    lines = [
        "| preset | generation | compiled | ok | failures by cause | estimate fits, compiler refuses | "
        "estimate refuses, compiler fits | median / max compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for r in reports:
        wrongly_in = [d for d in r["disagreements"] if d["estimate"] is None]
        wrongly_out = [d for d in r["disagreements"] if d["estimate"] is not None]
        med, top = r["compile_s"]["median"], r["compile_s"]["max"]
        lines.append(
            f"| {r['preset']} | {r['generation']} | {r['compiled']} | {r['ok']} | {r['failures_by_cause'] or '-'} | "
            f"{len(wrongly_in)} | {len(wrongly_out)} | "
            f"{'-' if med is None else f'{med:.1f}'} / {'-' if top is None else f'{top:.1f}'} |"
        )
        for d in r["disagreements"]:
            verdict = "compiles" if d["ok"] else f"{d['cause']}: {(d['error'] or '')[:120]}"
            details.append(
                f"| {r['preset']} | {r['generation']} | {d['describe']} | {d['estimate'] or 'fits'} | {verdict} |"
            )
    if details:
        lines += ["", "| preset | generation | config | estimate | compiler |", "|---|---|---|---|---|", *details]
    return "\n".join(lines) + "\n"


def print_compile_report(report: dict[str, Any], out: Any) -> None:
    """The report as a rich table on ``out``: every compiled config, then the summary."""
    from rich.markup import escape
    from rich.table import Table

    out.print(
        f"[bold]{report['preset']}[/bold] ({report['dtype']}) for {report['generation']} "
        f"({report['device_kind']}), libtpu {report['versions'].get('libtpu')}: space of {report['space']} configs, "
        f"{report['estimated_to_fit']} estimated to fit; {report['compiled']} compiled"
    )
    table = Table("config", "estimate", "compiler", "compile s", "agree")
    for r in report["configs"]:
        verdict = "ok" if r["ok"] else f"{r['cause']}: {(r['error'] or '')[:80]}"
        table.add_row(
            r["describe"],
            escape(r["estimate"] or "fits"),
            escape(verdict),
            f"{r['compile_s']:.2f}",
            "" if r["agree"] else "NO",
        )
    out.print(table)
    c = report["compile_s"]
    out.print(
        f"ok {report['ok']} of {report['compiled']}; failures by cause {report['failures_by_cause'] or 'none'}; "
        f"compile s median {c['median']}, max {c['max']}, total {c['total']:.1f}; "
        f"disagreements with the estimates: {len(report['disagreements'])}"
    )
