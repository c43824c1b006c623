"""How runs are timed: a CPU backend's measuring child runs on one core and reads the process's CPU
time, so a program XLA would spread over every core is compared on equal terms with the single-
threaded tiled kernel, and time the core spends on another process is not counted
(autotune.measure module doc); other backends, and unpinned processes, keep the wall clock."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax.numpy as jnp
import pytest

from autotune.measure import MeasureOptions, clock_for, timed_runs
from autotune.supervisor import Supervisor
from kernel.heuristic import heuristic_config

from .test_measurer_contract import LIVE

OPTIONS = MeasureOptions(repeats=2, min_time_s=0.0, check_rows=16)


def _sleeps(seconds: float) -> Any:
    def run(x: Any) -> Any:
        time.sleep(seconds)  # off the CPU: the wall clock moves, this process's CPU time does not
        return x

    return run


def test_the_cpu_clock_does_not_count_time_off_the_cpu_and_the_wall_clock_does() -> None:
    x = jnp.ones(4)
    wall, _ = timed_runs(_sleeps(0.05), (x,), warmup=0, repeats=3, clock="wall")
    cpu, _ = timed_runs(_sleeps(0.05), (x,), warmup=0, repeats=3, clock="cpu")
    assert min(wall) >= 50.0
    assert max(cpu) < 25.0, cpu


def test_a_process_on_several_cores_and_a_tpu_keep_the_wall_clock() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this test process already runs on one core")
    assert clock_for("xla") == "wall"  # CPU time would add up XLA's threads
    assert clock_for("tpu") == "wall"


@pytest.mark.parametrize("one_core", [True, False], ids=["one-core", "every-core"])
def test_the_measuring_child_of_a_cpu_backend_runs_on_one_core_in_cpu_time(one_core: bool) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs a machine with two cores to tell one from all")
    options = dataclasses.replace(OPTIONS, one_core=one_core)
    with Supervisor(LIVE, "xla", options, trial_timeout_s=120) as supervisor:
        clock = supervisor.clock()
        measured = supervisor.measure(heuristic_config(LIVE.pattern, "xla", LIVE.dtype))
    assert measured.status == "ok", measured.error
    assert os.sched_getaffinity(0) == set(allowed), "the parent must stay on every core"
    if one_core:
        assert clock["clock"] == "cpu" and len(clock["cores"]) == 1 and clock["cores"][0] in allowed
    else:
        assert clock["clock"] == "wall" and clock["cores"] == allowed


def test_the_measuring_child_of_a_cpu_workload_starts_no_other_jax_platform() -> None:
    """A CPU workload's child asks JAX for the CPU alone: left to probe every platform, JAX starts
    libtpu (installed by the `tpu` extra) on a machine without a TPU, which prints a misleading error;
    a workload of another device kind leaves the choice to JAX (and to JAX_PLATFORMS)."""
    assert LIVE.device_kind == "cpu"
    with Supervisor(LIVE, "xla", OPTIONS, trial_timeout_s=120) as supervisor:
        assert supervisor.clock()["platforms"] == "cpu"
    other = dataclasses.replace(LIVE, device_kind="TPU v5 lite")
    with Supervisor(other, "xla", OPTIONS, trial_timeout_s=120) as supervisor:
        assert supervisor.clock()["platforms"] == os.environ.get("JAX_PLATFORMS")
