"""The ``replay`` backend: measurements answered from a recorded exhaustive table.

``tiletune bench search --record`` measures every valid config of a workload
once and saves a :class:`RecordedTable` as JSON. Replaying it lets search
strategies (and later the distributed machinery) run without a device: each
answer is the recorded one, optionally after sleeping the recorded compile and
run time so wall-clock behaviour is realistic too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from autotune.measure import Measurement, config_key
from autotune.space import SearchSpace
from kernel.config import TileConfig
from kernel.workload import Workload

TABLE_FORMAT = 1


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
            entries[config_key(config)] = (config, Measurement.from_dict(item))
        return cls(
            Workload.from_dict(data["workload"]),
            data["backend"],
            data["device_kind"],
            entries,
            data.get("dense_ms"),
            data.get("versions", {}),
        )


class ReplayMeasurer:
    """A Measurer that answers from a table (``sleep=True`` spends the recorded time)."""

    def __init__(self, table: RecordedTable, sleep: bool = False) -> None:
        self.table = table
        self.sleep = sleep
        self.measured: list[str] = []

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        key = config_key(config)
        self.measured.append(key)
        entry = self.table.entries.get(key)
        if entry is None:
            return Measurement("failed", error="replay: config not in the recorded table")
        m = entry[1]
        if self.sleep:
            time.sleep(((m.compile_ms or 0.0) + sum(m.runs_ms)) / 1e3)
        return m

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        entry = self.table.entries.get(config_key(config))
        if entry is None or not entry[1].runs_ms:
            return []
        recorded = list(entry[1].runs_ms)
        return [recorded[i % len(recorded)] for i in range(runs)]

    def dense_ms(self, repeats: int = 5) -> float | None:
        return self.table.dense_ms
