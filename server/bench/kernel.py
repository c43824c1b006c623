"""``tiletune bench kernel``: the sparse kernel against dense attention, side by side.

For one workload (a preset, optionally with its layout or heads overridden) it
measures, in one process: dense attention with ``jax.nn.dot_product_attention``
(the dense anchor on this backend), every requested variant/config of the
sparse kernel (after checking its output on sampled rows against the float64
reference), the temporal heads with and without the temporal-major permutation,
and the time and peak memory of building the block tables of ``wan2.1-720p``.
Only ratios of figures from the same run are meaningful on a shared machine.
"""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from autotune.measure import Measurement, time_function
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
    repeats: int = 5
    min_time_s: float = 0.5
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
    timing_kw: dict[str, Any] = {"repeats": opts.repeats, "min_time_s": opts.min_time_s}
    say("dense anchor (jax.nn.dot_product_attention)")
    dense = time_function(dense_attention, (q, k, v), **timing_kw)
    report["dense"] = _timing_json(dense)

    base = heuristic_config(pattern, backend, dtype.name)
    variants = opts.variants or tuple(v for v in VARIANTS if backend != "xla" or v != "split")
    blocks = opts.blocks or (base.block_q,)
    configs = [
        dataclasses.replace(base, variant=cast(Variant, variant), block_q=b, block_kv=b, block_kv_compute=0)
        for variant in variants
        for b in blocks
    ]
    # A second anchor: the same backend and tiles on an all-dense pattern, so the
    # fraction of ideal is also shown against a tiled dense kernel, not only
    # against the library's dense attention.
    tiled_dense: dict[int, Measurement] = {}
    dense_pattern = SparsityPattern(layout, (HeadPattern.dense(),) * pattern.num_heads)
    for b in blocks:
        say(f"tiled dense anchor q{b} kv{b}")
        config = dataclasses.replace(
            base, variant="compact", block_q=b, block_kv=b, block_kv_compute=0, align="none", head_grouping="all"
        )
        tiled_dense[b] = _time_sparse(q, k, v, dense_pattern, config, backend, timing_kw)
    report["tiled_dense"] = {str(b): _timing_json(t) for b, t in tiled_dense.items()}
    results = []
    for config in configs:
        say(f"sparse {config.describe()}")
        timing = _time_sparse(q, k, v, pattern, config, backend, timing_kw)
        out = np.asarray(sparse_attention(q, k, v, pattern, config, backend), np.float64)
        err = float(np.abs(out[:, :, rows] - ref).max())
        counts = _tile_counts(pattern, config)
        results.append(
            {
                "config": config.to_dict(),
                "describe": config.describe(),
                **_timing_json(timing),
                "speedup": _ms(dense) / _ms(timing),
                "fraction_of_ideal": _ms(dense) / _ms(timing) * density,
                "speedup_vs_tiled_dense": _ms(tiled_dense[config.block_q]) / _ms(timing),
                "fraction_of_ideal_vs_tiled_dense": _ms(tiled_dense[config.block_q]) / _ms(timing) * density,
                "max_error": err,
                "correct": err <= tol,
                "tile_density": (counts["full"] + counts["partial"]) / counts["tiles"],
                "tiles": counts,
            }
        )
    report["configs"] = results

    temporal = [h for h in range(pattern.num_heads) if pattern.heads[h].kind == "temporal"]
    if temporal:
        say("temporal heads with and without the temporal-major permutation")
        sub = SparsityPattern(layout, tuple(pattern.heads[h] for h in temporal))
        idx = jnp.asarray(temporal)
        qs, ks, vs = (jnp.take(x, idx, axis=1) for x in (q, k, v))
        by_layout = {}
        for lay in ("frame_major", "temporal_major"):
            config = dataclasses.replace(heuristic_config(sub, backend, dtype.name), layout=lay)
            by_layout[lay] = _timing_json(_time_sparse(qs, ks, vs, sub, config, backend, timing_kw))
        report["temporal_layout"] = {
            "heads": len(temporal),
            **by_layout,
            "permutation_speedup": by_layout["frame_major"]["median_ms"] / by_layout["temporal_major"]["median_ms"],
        }
    if opts.table_preset:
        say(f"block tables of {opts.table_preset}")
        report["block_tables"] = bench_block_tables(opts.table_preset)
    return report


def _time_sparse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    pattern: SparsityPattern,
    config: TileConfig,
    backend: str,
    timing_kw: dict[str, Any],
) -> Measurement:
    def fn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return sparse_attention(q, k, v, pattern, config, backend)

    return time_function(fn, (q, k, v), **timing_kw)


def _ms(m: Measurement) -> float:
    """The median of a timed callable (time_function always times at least one run)."""
    assert m.median_ms is not None
    return m.median_ms


def _timing_json(m: Measurement) -> dict[str, Any]:
    stats = m.stats
    assert stats is not None and m.compile_ms is not None
    return {
        "compile_ms": round(m.compile_ms, 3),
        "median_ms": round(stats.median_ms, 4),
        "p10_ms": round(stats.p10_ms, 4),
        "p90_ms": round(stats.p90_ms, 4),
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
        _head_table.cache_clear()
        tracemalloc.start()
        t0 = time.perf_counter()
        tables = prepare_group(pat, list(range(pat.num_heads)), config)[2]
        elapsed = time.perf_counter() - t0
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
            f"{r['speedup']:.2f}x",
            f"{r['fraction_of_ideal']:.2f}",
            f"{r['speedup_vs_tiled_dense']:.2f}x",
            f"{r['fraction_of_ideal_vs_tiled_dense']:.2f}",
            f"{r['tile_density']:.3f}",
            f"{r['max_error']:.1e}" + ("" if r["correct"] else " WRONG"),
        )
    out.print(table)
    out.print(
        "speedup / of ideal: against jax.nn.dot_product_attention; vs tiled dense: against this backend "
        "running the same tiles on an all-dense pattern (1.00 of ideal = every masked pair skipped for free)"
    )
    if "temporal_layout" in report:
        t = report["temporal_layout"]
        out.print(
            f"temporal heads ({t['heads']}): frame-major {t['frame_major']['median_ms']:.2f} ms, "
            f"temporal-major {t['temporal_major']['median_ms']:.2f} ms -> permutation "
            f"{t['permutation_speedup']:.2f}x faster"
        )
    if "block_tables" in report:
        bt = report["block_tables"]
        for r in bt["runs"]:
            out.print(
                f"block tables {bt['preset']} ({bt['heads']} heads, {r['distinct_patterns']} distinct patterns, "
                f"{bt['seq_len']:,} tokens) {r['config']}: {r['build_ms']:.0f} ms, peak {r['peak_mb']:.1f} MB, "
                f"{r['full']:,} full / {r['partial']:,} partial / {r['empty']:,} empty tiles"
            )
