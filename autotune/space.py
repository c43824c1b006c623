"""The search space of one workload on one backend, and how samplers see it.

:class:`SearchSpace` is the kernel's candidate grid and validity rules
(:mod:`kernel.candidates`: tiling, padding, the VMEM/SMEM budget) bound to one
workload, so a search asks ``space.violation(config)`` before it measures
anything. :class:`ParamCoding` is the samplers' view of the same grid: tile
sizes as ordinal indices, the rest as categories.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import optuna

from kernel import candidates
from kernel.config import TileConfig
from kernel.cost import grid_steps
from kernel.pattern import SparsityPattern
from kernel.workload import Workload


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Valid TileConfigs of ``workload`` on ``backend`` (``tpu``, ``xla``, ``interpret``).

    ``blocks_q`` / ``blocks_kv`` narrow the tile sizes (default: the backend's grid).
    """

    workload: Workload
    backend: str
    max_padding: float = candidates.MAX_PADDING
    blocks_q: tuple[int, ...] = ()
    blocks_kv: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        dims = self.dimensions()  # validates the backend
        object.__setattr__(self, "blocks_q", dims["block_q"])
        object.__setattr__(self, "blocks_kv", dims["block_kv"])

    @property
    def pattern(self) -> SparsityPattern:
        return self.workload.pattern

    @functools.cached_property  # frozen: the grid of one workload never changes
    def _dims(self) -> dict[str, tuple[Any, ...]]:
        return candidates.dimensions(self.workload, self.backend, self.blocks_q, self.blocks_kv)

    def dimensions(self) -> dict[str, tuple[Any, ...]]:
        """The categorical choices of each parameter (the sampler's view)."""
        return dict(self._dims)

    def config_from(self, params: dict[str, Any]) -> TileConfig:
        return candidates.config_from(params)

    def params_of(self, config: TileConfig) -> dict[str, Any]:
        return candidates.params_of(config, self.backend)

    def violation(self, config: TileConfig) -> str | None:
        """Why ``config`` must not be measured, or None if it is valid."""
        return candidates.violation(self.workload, self.backend, config, self._dims, self.max_padding)

    def padding(self, config: TileConfig) -> float:
        return candidates.padding(self.workload, config)

    @functools.cached_property
    def _steps(self) -> dict[TileConfig, int]:
        return {}

    def grid_steps(self, config: TileConfig) -> int:
        """Tile visits of ``config`` (:func:`kernel.cost.grid_steps`) by the kernel version the
        workload names: a recorded table's, when its backend is this space's. Counted once per config:
        the count builds the config's block tables, and the default's model asks it for every valid config
        (``autotune.surrogate.features``)."""
        steps = self._steps.get(config)
        if steps is None:
            version = self.workload.kernel_version if self.workload.backend == self.backend else None
            steps = self._steps[config] = grid_steps(self.pattern, config, self.backend, version)
        return steps

    def candidates(self) -> list[TileConfig]:
        """Every point of the grid, valid or not."""
        return list(candidates.grid(self._dims))

    @functools.cached_property  # frozen: the rules and the grid of one space never change
    def _valid(self) -> tuple[TileConfig, ...]:
        return tuple(c for c in candidates.grid(self._dims) if self.violation(c) is None)

    def enumerate(self) -> list[TileConfig]:
        """Every valid point (for exhaustive runs), in a stable order."""
        return list(self._valid)


class ParamCoding:
    """How configs look to the sampler: tile sizes as ordinal indices into their sorted
    choices (so TPE and GP can exploit that neighbouring sizes perform alike), the rest
    as categories."""

    ORDINAL = ("block_q", "block_kv", "block_kv_compute")

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims = {k: tuple(sorted(v)) if k in self.ORDINAL else tuple(v) for k, v in space.dimensions().items()}

    @functools.cached_property
    def varying(self) -> tuple[str, ...]:
        """The dimensions with more than one choice: their values identify a config."""
        return tuple(n for n, choices in self.dims.items() if len(choices) > 1)

    def key(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """The identity of ``params`` (the coding is one-to-one with configs)."""
        return tuple(params[n] for n in self.varying)

    def trial_params(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
        """The params a trial stands for, as the samplers see them: an enqueued (WAITING) trial's fixed
        params, others' sampled ones, with the single-choice dimensions filled in (enqueued params may leave
        them out); None while they do not cover every dimension (a trial still being sampled, another space)."""
        state = optuna.trial.TrialState.WAITING
        given = trial.system_attrs.get("fixed_params", {}) if trial.state == state else trial.params
        params = {**{n: c[0] for n, c in self.dims.items() if len(c) == 1}, **given}
        return params if all(n in params for n in self.varying) else None

    def neighbours(self, params: dict[str, Any], diagonal: bool = False) -> list[dict[str, Any]]:
        """Params one step from ``params``: one tile size one ordinal step up or down, or one category
        switched to any other: where the local steps of `tpe` and `surrogate` look. With ``diagonal``, also
        ``block_q`` and ``block_kv`` one step in the same direction (the tile's shape kept, its area x4 or
        /4): a tile's time over those two sizes has valleys along that diagonal which single steps do not
        cross (temporal-sink-bf16: q128 kv128 1.04x the fastest, q64 kv128 and q128 kv64 1.08x, q64 kv64
        1.00x), so `surrogate` looks there too."""
        out = []
        if diagonal and self.is_ordinal("block_q") and self.is_ordinal("block_kv"):
            q, kv = int(params["block_q"]), int(params["block_kv"])
            for d in (-1, 1):
                if 0 <= q + d < len(self.dims["block_q"]) and 0 <= kv + d < len(self.dims["block_kv"]):
                    out.append({**params, "block_q": q + d, "block_kv": kv + d})
        for name in self.varying:
            choices = self.dims[name]
            if self.is_ordinal(name):
                i = int(params[name])
                values: list[Any] = [j for j in (i - 1, i + 1) if 0 <= j < len(choices)]
            else:
                values = [c for c in choices if c != params[name]]
            out += [{**params, name: v} for v in values]
        return out

    def is_ordinal(self, name: str) -> bool:
        return name in self.ORDINAL and len(self.dims[name]) > 1

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        out: dict[str, optuna.distributions.BaseDistribution] = {}
        for name, choices in self.dims.items():
            if self.is_ordinal(name):
                out[name] = optuna.distributions.IntDistribution(0, len(choices) - 1)
            else:
                out[name] = optuna.distributions.CategoricalDistribution(list(choices))
        return out

    def grid(self) -> dict[str, list[Any]]:
        return {k: list(range(len(v))) if self.is_ordinal(k) else list(v) for k, v in self.dims.items()}

    def decode(self, params: dict[str, Any]) -> TileConfig:
        values = {k: self.dims[k][int(v)] if self.is_ordinal(k) else v for k, v in params.items()}
        return self.space.config_from(values)

    def try_decode(self, params: dict[str, Any]) -> TileConfig | None:
        """The config of ``params``, or None when they name no config at all (on TPU-tiled backends,
        a ``block_kv_compute`` that does not divide ``block_kv``: samplers see the dimensions as
        independent, the grid does not)."""
        try:
            return self.decode(params)
        except ValueError:
            return None

    def encode(self, config: TileConfig) -> dict[str, Any] | None:
        """Sampler params of ``config``, or None if it lies outside the dimensions."""
        params = self.space.params_of(config)
        out: dict[str, Any] = {}
        for name, choices in self.dims.items():
            if params[name] not in choices:
                return None
            out[name] = choices.index(params[name]) if self.is_ordinal(name) else params[name]
        return out
