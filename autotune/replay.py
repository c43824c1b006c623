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
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.compare import interleaved, normalised_by_round, round_factors, tied_set
from autotune.measure import Measurement, MeasureOptions, RunStats, tiled_dense
from autotune.space import SearchSpace
from autotune.supervisor import MeasurementAborted, Supervisor
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.workload import Workload

ANCHORED_CONFIGS = 8  # record_table times the tiled dense anchors of this many of the fastest configs
TABLE_FORMAT = 2  # 2: interleaved runs, anchors and the recording's rounds; 1 (no anchors) still loads
TABLES = Path(__file__).resolve().parent / "tables"  # the recorded tables shipped as package data


def host_description(proc: Path = Path("/proc")) -> str:
    """This machine's CPU model and core count, e.g. ``AMD EPYC, 2 cores``: two tables of one workload
    recorded on different hosts differ by the host (the library's dense anchor, unchanged code, ran 1.5-2x
    its earlier time when three tables were re-recorded on another VM), and a table's header should say which."""
    try:
        lines = (proc / "cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    named = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    # platform.processor() may run `uname -p` in a subprocess: only asked when cpuinfo names no model.
    model = named or platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores"


def bundled_table(name: str) -> Path:
    """The path of a shipped table, e.g. ``small-mixed.xla.json``."""
    path = TABLES / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in TABLES.glob("*.xla.json")))
        raise ValueError(f"no shipped table {name!r}; shipped: {known}")
    return path


@dataclasses.dataclass
class RecordedTable:
    """Every valid config of a workload measured once, its runs taken in interleaved rounds.

    ``anchors`` holds the runs of the anchors timed in the same rounds: ``dense``
    (the library's dense attention) and ``tiled_dense:<config key>`` (the tiled
    dense anchor of each distinct tile size; :func:`autotune.measure.tiled_dense`).
    ``rounds`` is how many rounds the runs came from (0: a format-1 table); ``clock`` what the runs
    were read from (:func:`autotune.measure.clock_for`; ``wall`` for tables recorded before CPU
    backends were timed on one core in CPU time).
    """

    workload: Workload
    backend: str
    device_kind: str
    entries: dict[str, tuple[TileConfig, Measurement]]
    dense_ms: float | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    anchors: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    rounds: int = 0
    clock: str = "wall"
    host: str = ""  # the CPU the runs were taken on (:func:`host_description`); "" for tables older than it

    @property
    def best(self) -> tuple[TileConfig, Measurement]:
        ok = [(c, m) for c, m in self.entries.values() if m.status == "ok" and m.median_ms is not None]
        if not ok:
            raise ValueError("the table has no ok entry")
        return min(ok, key=lambda cm: cm[1].median_ms or 0.0)

    def _ok_runs(self) -> dict[str, tuple[float, ...]]:
        """The runs of every ok entry that has any, by key."""
        return {k: m.runs_ms for k, (_c, m) in self.entries.items() if m.status == "ok" and m.runs_ms}

    def tied_with_best(self, normalised: bool = False) -> set[str]:
        """Keys of the configs statistically tied with the fastest (:func:`autotune.compare.tied_set`):
        reaching any of them is a search's success. ``normalised``: test the runs divided by their round's
        factor (:func:`autotune.compare.normalised_by_round`), so a drift of the machine between rounds
        does not widen the set; every shipped figure is scored on the runs as recorded."""
        runs = self._ok_runs()
        return set(tied_set(normalised_by_round(runs) if normalised else runs))

    def round_factors(self) -> list[float]:
        """How fast each of the table's rounds ran against the others
        (:func:`autotune.compare.round_factors` over the ok entries' runs)."""
        return round_factors(self._ok_runs())

    def space(self) -> SearchSpace:
        """The table's search space: one instance for as long as the table's workload and backend stay,
        so what it counts once (valid configs, grid steps) serves every replay of the table."""
        cached = self.__dict__.get("_space")
        if cached is None or cached.workload is not self.workload or cached.backend != self.backend:
            cached = self.__dict__["_space"] = SearchSpace(self.workload, self.backend)
        return cached

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "workload": self.workload.canonical(),
            "backend": self.backend,
            "device_kind": self.device_kind,
            "dense_ms": self.dense_ms,
            "versions": self.versions,
            "rounds": self.rounds,
            "clock": self.clock,
            **({"host": self.host} if self.host else {}),
            "anchors": {name: list(runs) for name, runs in self.anchors.items()},
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
        if data.get("format") not in (1, TABLE_FORMAT):
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
            {name: tuple(runs) for name, runs in data.get("anchors", {}).items()},
            int(data.get("rounds", 0)),
            data.get("clock", "wall"),
            data.get("host", ""),
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

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        """Recorded runs of an anchor (cycled to ``runs``); [] when the table holds none."""
        if anchor == "tiled_dense" and config is not None:
            recorded = self.table.anchors.get(f"tiled_dense:{tiled_dense(self.table.workload.pattern, config)[1].key}")
        else:
            recorded = self.table.anchors.get(anchor)
        if not recorded:
            return []
        return [recorded[i % len(recorded)] for i in range(runs)]


def record_table(
    workload: Workload,
    *,
    measure: MeasureOptions | None = None,
    rounds: int = 10,
    trial_timeout_s: float = 300.0,
    progress: Callable[[str, int, int], None] | None = None,
    space: SearchSpace | None = None,
    seed: int = 0,
) -> RecordedTable:
    """Measure every valid config of ``space`` (default: the workload's full space), supervised as a
    real study is: each config is compiled and checked once, then every ok config and the anchors are
    timed in ``rounds`` interleaved rounds (:func:`autotune.compare.interleaved`), so the table's
    figures are comparable with each other. ``progress(stage, done, total)`` follows both phases."""
    space = space or SearchSpace(workload, workload.backend)
    configs = space.enumerate()
    first = dataclasses.replace(measure or MeasureOptions(), repeats=1, min_time_s=0.0, keep_compiled=len(configs) + 64)
    say = progress or (lambda _stage, _done, _total: None)
    checked: dict[str, tuple[TileConfig, Measurement]] = {}
    with Supervisor(workload, workload.backend, first, trial_timeout_s) as supervisor:
        clock = supervisor.clock()["clock"]
        for i, config in enumerate(configs):
            checked[config.key] = (config, supervisor.measure(config))
            say(f"checked {config.describe()}", i + 1, len(configs))
        ok = {k: c for k, (c, m) in checked.items() if m.status == "ok"}
        # The tiled dense anchors of the fastest configs of the first pass: the ones a search can pick
        # (timing one per tile size of the table would cost as much again as the table itself).
        first_pass = sorted(ok, key=lambda k: checked[k][1].median_ms or float("inf"))[:ANCHORED_CONFIGS]
        tiles = {tiled_dense(workload.pattern, ok[k])[1].key: ok[k] for k in first_pass}
        keys = [*ok, "dense", *(f"tiled_dense:{k}" for k in tiles)]
        visits = {"n": 0}

        def visit(key: str) -> list[float]:
            visits["n"] += 1
            say("timing in interleaved rounds", visits["n"], len(keys) * rounds)
            if key == "dense":
                return supervisor.anchor_runs("dense", 1)
            if key.startswith("tiled_dense:"):
                return supervisor.anchor_runs("tiled_dense", 1, tiles[key.split(":", 1)[1]])
            return supervisor.retime(ok[key], 1)

        runs = interleaved(keys, visit, rounds, seed=seed)
    entries = {}
    for key, (config, m) in checked.items():
        timed = tuple(runs[key]) if key in ok else m.runs_ms
        entries[key] = (config, dataclasses.replace(m, runs_ms=timed))
    anchors = {k: tuple(v) for k, v in runs.items() if k not in ok}
    dense = RunStats.of(anchors.get("dense", ()))
    versions = {k: v for k, v in software_versions(workload.backend).items() if v}
    return RecordedTable(
        workload,
        workload.backend,
        workload.device_kind,
        entries,
        dense.median_ms if dense else None,
        versions,
        anchors,
        rounds,
        clock,
        host_description(),
    )
