"""A tuned workload with a realistic trial history, seeded through the store functions.

The trials cover two variants x two layouts x four tile sizes (so the heatmap
has small multiples), every failure status, a pruned trial with a partial
median, and an invalid proposal (no trial number); the winner is published with
a re-timed spread, both anchors' times and the speedups' kept spread. A finished
job owns the trials; a second workload's job is running on one worker, with one
trial measured and one being measured (status ``running``).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from kernel.config import TileConfig
from kernel.presets import get_preset
from kernel.workload import Workload
from server.store import models, queue, records, workloads
from server.store.db import Database

VERSIONS = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None}
BLOCKS = (32, 64, 128, 256)
DENSE_MS = 240.0
TILED_DENSE_MS = 80.0


@dataclasses.dataclass(frozen=True)
class Seeded:
    key: str
    other_key: str
    trials: int
    winner: TileConfig
    statuses: dict[str, int]


def seed_tuned_workload(db: Database, preset: str = "cpu-demo", device_kind: str = "cpu") -> Seeded:
    p = get_preset(preset)
    wl = Workload(device_kind, "xla", "float32", 1, p.head_dim, p.pattern())
    other = Workload(device_kind, "xla", "float32", 1, p.head_dim, p.pattern(p.heads_per_chip + 2))
    rng = np.random.default_rng(7)
    statuses: dict[str, int] = {}
    with db.transaction() as session:
        row = workloads.workload_row(session, wl)
        job, _ = queue.enqueue_job(session, row, budget=48, requested_by="seed")
        number = 0
        best: tuple[float, TileConfig, int] | None = None
        grid = itertools.product(("compact", "naive"), ("temporal_major", "frame_major"), BLOCKS, BLOCKS)
        for variant, layout, bq, bkv in grid:
            if (BLOCKS.index(bq) + BLOCKS.index(bkv)) % 2:  # half the grid (a checkerboard), as a search would
                continue
            config = TileConfig(variant, bq, bkv, 0, layout, "frame" if bq == bkv else "none", "by_pattern")  # type: ignore[arg-type]
            # Slower for naive, frame-major and small tiles; fastest around 128 x 128.
            ms = 20.0 * (1.6 if variant == "naive" else 1.0) * (2.5 if layout == "frame_major" else 1.0)
            ms *= 1.0 + 0.15 * (abs(np.log2(bq / 128)) + abs(np.log2(bkv / 128))) + float(rng.uniform(0, 0.05))
            status = {5: "failed", 9: "crashed", 13: "timeout", 17: "wrong", 21: "pruned"}.get(number, "ok")
            fields: dict = {"number": number, "job_id": job.id, "compile_ms": float(300 + 40 * rng.random())}
            if status in ("ok", "wrong", "pruned"):
                fields.update(median_ms=ms, p10_ms=ms * 0.97, p90_ms=ms * 1.04)
            if status != "ok":
                fields["error"] = {
                    "failed": "XlaRuntimeError: RESOURCE_EXHAUSTED: out of memory <allocating 2.0GiB>",
                    "crashed": "child killed by SIGKILL",
                    "timeout": "no result in 300 s",
                    "wrong": "max error 3.1e-01 > 2e-05",
                    "pruned": "median after 2 runs above 1.5x the best",
                }[status]
            trial = records.record_trial(session, row, config.to_dict(), status, **fields)
            statuses[status] = statuses.get(status, 0) + 1
            if status == "ok" and (best is None or ms < best[0]):
                best = (ms, config, trial.id)
            number += 1
        records.record_trial(
            session,
            row,
            TileConfig("compact", 256, 32, 0, "temporal_major", "frame", "all").to_dict(),
            "invalid",
            job_id=job.id,
            error="padding: frame alignment adds 50% tokens (limit 25%)",
        )
        statuses["invalid"] = 1
        assert best is not None
        ms, winner, trial_id = best
        records.publish_tuned_config(
            session,
            row,
            winner.to_dict(),
            median_ms=ms * 1.01,
            p10_ms=ms * 0.96,
            p90_ms=ms * 1.08,
            dense_ms=DENSE_MS,
            tiled_dense_ms=TILED_DENSE_MS,
            speedup_p10_p90={  # as a tune keeps them: the pairs' p10-p90 around the ratio of the medians
                anchor: [anchor_ms / (ms * 1.01) * 0.93, anchor_ms / (ms * 1.01) * 1.06]
                for anchor, anchor_ms in (("dense", DENSE_MS), ("tiled_dense", TILED_DENSE_MS))
            },
            versions=VERSIONS,
            trial=session.get(models.Trial, trial_id),
        )
        job.status = "done"
        session.commit()
        other_row = workloads.workload_row(session, other)
        queue.enqueue_job(session, other_row, budget=32, requested_by="seed")
        claimed = queue.claim_job(session, "seed-worker", device_kind=device_kind, backend="xla")
        assert claimed is not None and claimed.workload_id == other_row.id
        done = queue.reserve_trial(session, claimed.id, "seed-worker", winner.to_dict(), number=0)
        assert done.verdict == "reserved" and done.trial_id is not None
        assert queue.complete_trial(
            session, done.trial_id, "seed-worker", "ok", median_ms=31.5, p10_ms=30.9, p90_ms=33.0
        )
        smaller = dataclasses.replace(winner, block_q=winner.block_q // 2)
        running = queue.reserve_trial(session, claimed.id, "seed-worker", smaller.to_dict(), number=1)
        assert running.verdict == "reserved"
    return Seeded(wl.key, other.key, number + 1, winner, statuses)
