"""``tiletune bench kernel``: the sparse kernel against dense attention, side by side.

For one workload (a preset, optionally with its layout or heads overridden) it
times, in one process and in interleaved rounds (every callable once per round,
in a fresh order: :func:`autotune.compare.interleaved`): dense attention with
``jax.nn.dot_product_attention`` (the library's dense anchor), the same backend
running the same tiles on an all-dense pattern (the tiled dense anchor), every
requested variant/config of the sparse kernel (its output checked on sampled
rows against the float64 reference), and the temporal heads with and without
the temporal-major permutation. Every ratio comes with the p-value of its
Mann-Whitney test. It also reports the time and peak memory of building the
block tables of ``wan2.1-720p``. Only ratios of figures from the same run are
meaningful on a shared machine.
"""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from autotune.compare import Difference, difference, interleaved
from autotune.measure import RunStats, tiled_dense, timed_runs
from kernel.attention import prepare_group, resolve_backend, sparse_attention
from kernel.block_tables import _head_table
from kernel.config import VARIANTS, TileConfig, Variant
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import get_preset
from kernel.reference import TOLERANCE, dense_attention, mask_density, reference_attention

CHECK_ROWS = 48


def parse_heads(spec: str, layout: VideoLayout) -> SparsityPattern:
    """``KIND[:WINDOW][+sink]xCOUNT`` items joined by commas, e.g. ``spatial:1x2,temporal:32x2``."""
    heads: list[HeadPattern] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        body, sep, count = item.rpartition("x")
        if not sep or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--heads item {item!r}: expected KIND[:WINDOW][+sink]xCOUNT")
        sink = body.endswith("+sink")
        body = body.removesuffix("+sink")
        kind, _, window = body.partition(":")
        if kind not in ("dense", "spatial", "temporal", "band"):
            raise ValueError(f"--heads item {item!r}: unknown kind {kind!r}")
        if window and not window.isdigit():
            raise ValueError(f"--heads item {item!r}: window must be a non-negative integer")
        heads.extend([HeadPattern(kind, int(window or 0), sink)] * int(count))  # type: ignore[arg-type]
    return SparsityPattern(layout, tuple(heads))


@dataclasses.dataclass
class KernelBenchOptions:
    preset: str = "cpu-demo"
    backend: str = "xla"
    frames: int | None = None
    tokens_per_frame: int | None = None
    heads: str | None = None
    dtype: str | None = None
    batch: int = 1
    blocks: tuple[int, ...] = ()
    variants: tuple[str, ...] = ()
    repeats: int = 1  # timed runs per visit of a round
    rounds: int = 10  # interleaved rounds: every callable runs repeats x rounds times
    seed: int = 0
    table_preset: str | None = "wan2.1-720p"


def bench_kernel(opts: KernelBenchOptions, progress: Any = None) -> dict[str, Any]:
    """Run the benchmark; returns a JSON-able report."""
    say = progress or (lambda _msg: None)
    preset = get_preset(opts.preset)
    layout = preset.layout
    if opts.frames or opts.tokens_per_frame:
        layout = dataclasses.replace(
            layout,
            frames=opts.frames or layout.frames,
            tokens_per_frame=opts.tokens_per_frame or layout.tokens_per_frame,
        )
    pattern = parse_heads(opts.heads, layout) if opts.heads else dataclasses.replace(preset, layout=layout).pattern()
    backend = resolve_backend(opts.backend)
    if backend == "interpret":
        raise ValueError("interpret mode checks correctness only; its timing says nothing about kernel speed")
    dtype = jnp.dtype(opts.dtype or ("float32" if backend == "xla" else preset.dtype))
    shape = (opts.batch, pattern.num_heads, pattern.seq_len, preset.head_dim)
    keys = jax.random.split(jax.random.PRNGKey(opts.seed), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)
    rows = np.unique(np.random.default_rng(opts.seed).integers(0, pattern.seq_len, CHECK_ROWS))
    ref = reference_attention(q, k, v, pattern, rows=rows)
    tol = TOLERANCE[dtype.name]
    density = mask_density(pattern)
    report: dict[str, Any] = {
        "preset": preset.name,
        "pattern": pattern.describe(),
        "backend": backend,
        "device": jax.devices()[0].device_kind,
        "shape": list(shape),
        "dtype": dtype.name,
        "density": density,
        "ideal_speedup": 1.0 / density,
    }
    base = heuristic_config(pattern, backend, dtype.name)
    variants = opts.variants or tuple(v for v in VARIANTS if backend != "xla" or v != "split")
    blocks = opts.blocks or (base.block_q,)
    configs = [
        dataclasses.replace(base, variant=cast(Variant, variant), block_q=b, block_kv=b, block_kv_compute=0)
        for variant in variants
        for b in blocks
    ]
    # Every timed callable, compiled first, then timed in interleaved rounds (one visit each per round, in a
    # fresh order): the anchors and the configs see the same machine, so their ratios are meaningful.
    # Anchors: jax.nn.dot_product_attention, and the same backend and tiles on an all-dense pattern.
    candidates: dict[str, tuple[Any, tuple[jax.Array, ...]]] = {"dense": (dense_attention, (q, k, v))}
    for b in blocks:
        dense_pattern, tiles = tiled_dense(
            pattern, dataclasses.replace(base, block_q=b, block_kv=b, block_kv_compute=0)
        )
        candidates[f"tiled_dense:{b}"] = (_sparse_fn(dense_pattern, tiles, backend), (q, k, v))
    for i, config in enumerate(configs):
        candidates[f"config:{i}"] = (_sparse_fn(pattern, config, backend), (q, k, v))
    temporal = [h for h in range(pattern.num_heads) if pattern.heads[h].kind == "temporal"]
    if temporal:
        sub = SparsityPattern(layout, tuple(pattern.heads[h] for h in temporal))
        idx = jnp.asarray(temporal)
        sub_args = tuple(jnp.take(x, idx, axis=1) for x in (q, k, v))
        for lay in ("frame_major", "temporal_major"):
            config = dataclasses.replace(heuristic_config(sub, backend, dtype.name), layout=lay)
            candidates[f"temporal:{lay}"] = (_sparse_fn(sub, config, backend), sub_args)
    compiled, compile_ms = {}, {}
    for name, (fn, args) in candidates.items():
        say(f"compiling {name}")
        t0 = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(*args).compile()
        compile_ms[name] = (time.perf_counter() - t0) * 1e3
        jax.block_until_ready(compiled[name](*args))  # warm-up, untimed

    def visit(name: str) -> list[float]:
        return timed_runs(compiled[name], candidates[name][1], warmup=0, repeats=opts.repeats)[0]

    say(f"timing {len(candidates)} callables in {opts.rounds} interleaved rounds")
    runs = interleaved(candidates, visit, opts.rounds, seed=opts.seed)

    def timing(name: str) -> dict[str, Any]:
        stats = RunStats.of(runs[name])
        assert stats is not None
        return {"compile_ms": round(compile_ms[name], 3), **_stats_json(stats)}

    report["dense"] = timing("dense")
    report["tiled_dense"] = {str(b): timing(f"tiled_dense:{b}") for b in blocks}
    results = []
    for i, config in enumerate(configs):
        name = f"config:{i}"
        out = np.asarray(sparse_attention(q, k, v, pattern, config, backend), np.float64)
        err = float(np.abs(out[:, :, rows] - ref).max())
        counts = _tile_counts(pattern, config)
        vs_dense = difference(runs["dense"], runs[name])
        vs_tiled = difference(runs[f"tiled_dense:{config.block_q}"], runs[name])
        results.append(
            {
                "config": config.to_dict(),
                "describe": config.describe(),
                **timing(name),
                "speedup": vs_dense.ratio,
                "speedup_p_value": vs_dense.p_value,
                "fraction_of_ideal": vs_dense.ratio * density,
                "speedup_vs_tiled_dense": vs_tiled.ratio,
                "speedup_vs_tiled_dense_p_value": vs_tiled.p_value,
                "fraction_of_ideal_vs_tiled_dense": vs_tiled.ratio * density,
                "max_error": err,
                "correct": err <= tol,
                "tile_density": (counts["full"] + counts["partial"]) / counts["tiles"],
                "tiles": counts,
            }
        )
    report["configs"] = results
    if temporal:
        permutation = difference(runs["temporal:frame_major"], runs["temporal:temporal_major"])
        report["temporal_layout"] = {
            "heads": len(temporal),
            "frame_major": timing("temporal:frame_major"),
            "temporal_major": timing("temporal:temporal_major"),
            "permutation_speedup": permutation.ratio,
            "permutation_p_value": permutation.p_value,
            "permutation_real": permutation.real,
        }
    if opts.table_preset:
        say(f"block tables of {opts.table_preset}")
        report["block_tables"] = bench_block_tables(opts.table_preset)
    return report


def _sparse_fn(pattern: SparsityPattern, config: TileConfig, backend: str) -> Any:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return sparse_attention(q, k, v, pattern, config, backend)

    return fn


def _stats_json(stats: RunStats) -> dict[str, Any]:
    return {
        "median_ms": round(stats.median_ms, 4),
        "p10_ms": round(stats.p10_ms, 4),
        "p90_ms": round(stats.p90_ms, 4),
        "spread": round(stats.spread, 4),
        "runs": stats.runs,
    }


def _tile_counts(pattern: SparsityPattern, config: TileConfig) -> dict[str, int]:
    from kernel.attention import head_groups

    total: dict[str, int] = {}
    for heads in head_groups(pattern, config):
        for key, value in prepare_group(pattern, heads, config)[2].counts().items():
            total[key] = total.get(key, 0) + value
    return total


def bench_block_tables(preset_name: str) -> dict[str, Any]:
    """Build the block tables of all heads of a preset from cold caches: time and peak memory.

    Heads that share a pattern share a table, so a third run gives every head its
    own temporal window: the cost with nothing shared (O(tiles) per head).
    """
    preset = get_preset(preset_name)
    pattern = preset.pattern(preset.heads)
    out: dict[str, Any] = {
        "preset": preset_name,
        "heads": pattern.num_heads,
        "distinct_patterns": len(pattern.classes()),
        "seq_len": pattern.seq_len,
    }
    distinct = SparsityPattern(
        pattern.layout,
        tuple(
            dataclasses.replace(h, window=h.window + i)
            if h.kind == "temporal"
            else dataclasses.replace(h, window=i % 3)
            for i, h in enumerate(pattern.heads)
        ),
    )
    runs = []
    for backend, pat in (("xla", pattern), ("tpu", pattern), ("xla", distinct)):
        config = dataclasses.replace(heuristic_config(pat, backend, preset.dtype), head_grouping="all")
        heads = list(range(pat.num_heads))
        # Timed from cold caches without tracemalloc (which slows allocation-heavy code several-fold);
        # the peak memory comes from a second cold build under tracemalloc.
        _head_table.cache_clear()
        t0 = time.perf_counter()
        tables = prepare_group(pat, heads, config)[2]
        elapsed = time.perf_counter() - t0
        _head_table.cache_clear()
        tracemalloc.start()
        prepare_group(pat, heads, config)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        runs.append(
            {
                "config": config.describe(),
                "distinct_patterns": len(pat.classes()),
                "build_ms": elapsed * 1e3,
                "peak_mb": peak / 2**20,
                **tables.counts(),
            }
        )
    _head_table.cache_clear()
    out["runs"] = runs
    return out


def _ratio(ratio: float, p_value: float) -> str:
    """A speedup as shown: marked a tie when it is within the noise of its measurement."""
    return f"{ratio:.2f}x" + ("" if Difference(ratio, p_value).real else " (tie)")


def print_kernel_report(report: dict[str, Any], out: Any) -> None:
    """The report as rich tables on ``out`` (a rich Console)."""
    from rich.table import Table

    out.print(f"[bold]{report['preset']}[/bold]: {report['pattern']}")
    out.print(f"backend {report['backend']} on {report['device']}, shape {report['shape']} {report['dtype']}")
    out.print(
        f"mask density {report['density']:.4f} -> ideal speedup {report['ideal_speedup']:.2f}x; "
        f"dense (jax.nn.dot_product_attention) {report['dense']['median_ms']:.2f} ms"
    )
    table = Table(
        "config",
        "median ms",
        "p10-p90 ms",
        "speedup",
        "of ideal",
        "vs tiled dense",
        "of ideal",
        "tile density",
        "max err",
    )
    for r in report["configs"]:
        table.add_row(
            r["describe"],
            f"{r['median_ms']:.2f}",
            f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}",
            _ratio(r["speedup"], r["speedup_p_value"]),
            f"{r['fraction_of_ideal']:.2f}",
            _ratio(r["speedup_vs_tiled_dense"], r["speedup_vs_tiled_dense_p_value"]),
            f"{r['fraction_of_ideal_vs_tiled_dense']:.2f}",
            f"{r['tile_density']:.3f}",
            f"{r['max_error']:.1e}" + ("" if r["correct"] else " WRONG"),
        )
    out.print(table)
    out.print(
        "speedup / of ideal: against jax.nn.dot_product_attention; vs tiled dense: against this backend "
        "running the same tiles on an all-dense pattern (1.00 of ideal = every masked pair skipped for free); "
        f"medians of {report['dense']['runs']} runs each, timed in interleaved rounds; (tie): the difference is "
        "within the noise (Mann-Whitney p >= 0.05, or under 1%)"
    )
    if "temporal_layout" in report:
        t = report["temporal_layout"]
        out.print(
            f"temporal heads ({t['heads']}): frame-major {t['frame_major']['median_ms']:.2f} ms, "
            f"temporal-major {t['temporal_major']['median_ms']:.2f} ms -> permutation "
            f"{_ratio(t['permutation_speedup'], t['permutation_p_value'])} faster"
        )
    if "block_tables" in report:
        bt = report["block_tables"]
        for r in bt["runs"]:
            out.print(
                f"block tables {bt['preset']} ({bt['heads']} heads, {r['distinct_patterns']} distinct patterns, "
                f"{bt['seq_len']:,} tokens) {r['config']}: {r['build_ms']:.0f} ms, peak {r['peak_mb']:.1f} MB, "
                f"{r['full']:,} full / {r['partial']:,} partial / {r['empty']:,} empty tiles"
            )
