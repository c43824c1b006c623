"""The ``replay`` backend: measurements answered from a recorded exhaustive table.

:func:`record_table` (``tiletune bench search --record``) measures every valid
config of a workload once and a :class:`RecordedTable` saves it as JSON.
Replaying it lets search strategies and the distributed machinery run without a
device: each answer is the recorded one, optionally after sleeping a fraction
of the recorded compile and run time, so wall-clock behaviour is realistic too.

The tables recorded for tiletune's own strategy decisions ship with the package
(:data:`TABLES`, ``autotune/tables/*.json``), so ``tiletune bench search`` and
``tiletune bench workers`` work from an installed package.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.measure import Measurement, MeasureOptions
from autotune.space import SearchSpace
from autotune.supervisor import MeasurementAborted, Supervisor
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.workload import Workload

TABLE_FORMAT = 1
TABLES = Path(__file__).resolve().parent / "tables"  # the recorded tables shipped as package data


def bundled_table(name: str) -> Path:
    """The path of a shipped table, e.g. ``small-mixed.xla.json``."""
    path = TABLES / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in TABLES.glob("*.xla.json")))
        raise ValueError(f"no shipped table {name!r}; shipped: {known}")
    return path


@dataclasses.dataclass
class RecordedTable:
    workload: Workload
    backend: str
    device_kind: str
    entries: dict[str, tuple[TileConfig, Measurement]]
    dense_ms: float | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def best(self) -> tuple[TileConfig, Measurement]:
        ok = [(c, m) for c, m in self.entries.values() if m.status == "ok" and m.median_ms is not None]
        if not ok:
            raise ValueError("the table has no ok entry")
        return min(ok, key=lambda cm: cm[1].median_ms or 0.0)

    def space(self) -> SearchSpace:
        return SearchSpace(self.workload, self.backend)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "workload": self.workload.canonical(),
            "backend": self.backend,
            "device_kind": self.device_kind,
            "dense_ms": self.dense_ms,
            "versions": self.versions,
            "entries": [
                {"config": c.to_dict(), **{k: v for k, v in m.to_dict().items() if v not in (None, ())}}
                for c, m in self.entries.values()
            ],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RecordedTable:
        data = json.loads(Path(path).read_text())
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"{path}: not a tiletune table (format {data.get('format')!r})")
        entries = {}
        for item in data["entries"]:
            config = TileConfig.from_dict(item.pop("config"))
            entries[config.key] = (config, Measurement.from_dict(item))
        return cls(
            Workload.from_dict(data["workload"]),
            data["backend"],
            data["device_kind"],
            entries,
            data.get("dense_ms"),
            data.get("versions", {}),
        )


class ReplayMeasurer:
    """A Measurer that answers from a table.

    ``sleep``: the fraction of each recorded compile + run time to spend before
    answering (stands for device time). ``abort``: when set during that sleep, the
    measurement is abandoned with :class:`~autotune.supervisor.MeasurementAborted`,
    as a supervised child's would be (a worker that lost its job).
    """

    def __init__(self, table: RecordedTable, sleep: float = 0.0, abort: threading.Event | None = None) -> None:
        self.table = table
        self.sleep = sleep
        self.abort = abort or threading.Event()
        self.measured: list[str] = []

    def __enter__(self) -> ReplayMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        self.measured.append(config.key)
        entry = self.table.entries.get(config.key)
        if entry is None:
            return Measurement("failed", error="replay: config not in the recorded table")
        m = entry[1]
        if self.sleep > 0 and self.abort.wait(self.sleep * ((m.compile_ms or 0.0) + sum(m.runs_ms)) / 1e3):
            raise MeasurementAborted("abandoned while replaying")
        return m

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        entry = self.table.entries.get(config.key)
        if entry is None or not entry[1].runs_ms:
            return []
        recorded = list(entry[1].runs_ms)
        return [recorded[i % len(recorded)] for i in range(runs)]

    def dense_ms(self, repeats: int = 5) -> float | None:
        return self.table.dense_ms


def record_table(
    workload: Workload,
    *,
    measure: MeasureOptions | None = None,
    trial_timeout_s: float = 300.0,
    progress: Callable[[int, int, TileConfig, Measurement], None] | None = None,
    space: SearchSpace | None = None,
) -> RecordedTable:
    """Measure every valid config of ``space`` (default: the workload's full space) once,
    supervised as a real study is."""
    space = space or SearchSpace(workload, workload.backend)
    configs = space.enumerate()
    entries = {}
    with Supervisor(workload, workload.backend, measure, trial_timeout_s) as supervisor:
        for i, config in enumerate(configs):
            m = supervisor.measure(config)
            entries[config.key] = (config, m)
            if progress is not None:
                progress(i + 1, len(configs), config, m)
        dense = supervisor.dense_ms()
    versions = {k: v for k, v in software_versions().items() if v}
    return RecordedTable(workload, workload.backend, workload.device_kind, entries, dense, versions)
