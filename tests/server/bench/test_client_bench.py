"""``tiletune bench client``: a tiny run reports every path, with the sources it should have served.

No figure is compared with a wall-clock expectation: only the report's structure and its answers.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from server.cli import app


def test_bench_client_reports_every_path() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench", "client", "--rounds", "2", "--number", "1000", "--disk-calls", "3", "--server-calls", "2",
            "--hang-calls", "1", "--timeout", "0.2", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    lookups = report["lookups"]
    assert set(lookups) == {"empty_loop", "dict", "memory", "disk", "server_cold", "server_warm"}
    # The floor is a call with the resolver's own arguments, keyed by the same shape tuple.
    assert lookups["dict"]["statement"] == "tuned(pattern, shape, backend, dtype)"
    assert lookups["memory"]["statement"] == "resolve(pattern, shape, backend, dtype)"
    assert lookups["disk"]["count"] == 3 and lookups["server_cold"]["count"] == 2
    for name in ("disk", "server_cold", "server_warm"):
        assert lookups[name]["max_ms"] >= lookups[name]["p90_ms"] >= lookups[name]["p50_ms"]
    # A first resolution in a new process reads and parses a file: far above an in-memory hit, and its
    # client import (jax included) is reported apart, not inside it.
    assert lookups["disk"]["p50_ms"] * 1e6 > lookups["memory"]["ns"]
    assert lookups["disk"]["import_client_ms"] > lookups["disk"]["p50_ms"]
    # A hanging server costs the whole timeout before the heuristic, never less.
    assert report["hanging"]["p50_ms"] >= 0.2 * 1000
    assert report["hanging"]["heuristic"] and report["refused"]["heuristic"]
    assert report["hanging"]["max_overhead_ms"] is not None and report["refused"]["max_overhead_ms"] is None
    assert set(report["checks"]) == {
        "memory_within_10x_dict",
        "hang_within_timeout_plus_250ms",
        "fallbacks_are_the_heuristic",
    }
    assert report["checks"]["fallbacks_are_the_heuristic"]
