"""The search space: every TileConfig worth measuring for one workload on one backend.

Every rule is checked before any compile, so an invalid point is never measured:
 - tiling rules: on TPU (and in TPU interpret mode, which emulates it) block_q a
   multiple of the sublane count (8 for f32, 16 for bf16), block_kv and
   block_kv_compute multiples of 128 lanes, block_kv_compute dividing block_kv;
 - padding: frame alignment and rounding the sequence up to whole tiles may add
   at most ``max_padding`` (25%) extra tokens;
 - VMEM (TPU): the kernel's double-buffered q/k/v/o blocks, its f32 scratch and
   the score tile must fit the chip generation's scoped VMEM budget below;
 - SMEM (TPU): the scalar-prefetched tables (``compact``: two int32 per
   non-empty tile; ``naive``/``split``: one int32 per tile) must fit SMEM.
Choices that cannot matter are left out: ``layout`` only when some head is
temporal, ``head_grouping`` only with several distinct head patterns, and on the
``xla`` backend ``split`` (the same XLA program as ``compact``) and
``block_kv_compute`` (always block_kv).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

from kernel.attention import head_groups, prepare_group
from kernel.config import TPU_LANES, TileConfig
from kernel.workload import Workload

# Scoped VMEM budget per TPU generation: what one kernel may use without raising
# Mosaic's default scoped limit (16 MiB up to v5, 32 MiB from v6e on); physical
# VMEM per core is larger (v4 16 MiB, v5e/v6e 128 MiB, v5p/v7 64 MiB).
VMEM_BUDGET_BYTES: dict[str, int] = {
    "TPU v4": 16 << 20,
    "TPU v4 lite": 16 << 20,
    "TPU v5 lite": 16 << 20,
    "TPU v5e": 16 << 20,
    "TPU v5": 16 << 20,
    "TPU v5p": 16 << 20,
    "TPU v6 lite": 32 << 20,
    "TPU v6e": 32 << 20,
    "TPU7x": 32 << 20,
}
DEFAULT_VMEM_BUDGET = 16 << 20
SMEM_BUDGET_BYTES = 1 << 20  # 1 MiB per core from v4 on (16 KiB on v2/v3)
SMEM_BUDGET_OLD = 16 << 10

XLA_BLOCKS = (32, 64, 128, 256, 512)
TPU_BLOCKS_Q = (128, 256, 512, 1024, 2048)
TPU_BLOCKS_KV = (128, 256, 512, 1024, 2048)
TPU_BLOCKS_KV_COMPUTE = (128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Valid TileConfigs of ``workload`` on ``backend`` (``tpu``, ``xla``, ``interpret``)."""

    workload: Workload
    backend: str
    max_padding: float = 0.25
    blocks_q: tuple[int, ...] = ()
    blocks_kv: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in ("tpu", "xla", "interpret"):
            raise ValueError(f"backend must be tpu, xla or interpret, got {self.backend!r}")
        tpu_like = self.backend != "xla"
        if not self.blocks_q:
            object.__setattr__(self, "blocks_q", TPU_BLOCKS_Q if tpu_like else XLA_BLOCKS)
        if not self.blocks_kv:
            object.__setattr__(self, "blocks_kv", TPU_BLOCKS_KV if tpu_like else XLA_BLOCKS)

    # ---------------------------------------------------------------- dimensions

    @property
    def pattern(self) -> Any:
        return self.workload.pattern

    def dimensions(self) -> dict[str, tuple[Any, ...]]:
        """The categorical choices of each parameter (the sampler's view)."""
        temporal = any(h.kind == "temporal" for h in self.pattern.heads)
        several = len(self.pattern.classes()) > 1
        tpu_like = self.backend != "xla"
        return {
            "variant": ("naive", "split", "compact") if tpu_like else ("naive", "compact"),
            "block_q": self.blocks_q,
            "block_kv": self.blocks_kv,
            "block_kv_compute": TPU_BLOCKS_KV_COMPUTE if tpu_like else (0,),
            "layout": ("frame_major", "temporal_major") if temporal else ("frame_major",),
            "align": ("none", "frame"),
            "head_grouping": ("all", "by_pattern") if several else ("by_pattern",),
        }

    def config_from(self, params: dict[str, Any]) -> TileConfig:
        """A TileConfig from sampled params (``block_kv_compute`` 0 = block_kv)."""
        params = dict(params)
        if params.get("block_kv_compute", 0) in (0, None):
            params["block_kv_compute"] = params["block_kv"]
        return TileConfig(**params)

    # ---------------------------------------------------------------- rules

    def violation(self, config: TileConfig) -> str | None:
        """Why ``config`` must not be measured, or None if it is valid."""
        dims = self.dimensions()
        for name, choices in dims.items():
            value = getattr(config, name)
            if name == "block_kv_compute":
                if self.backend == "xla" and value != config.block_kv:
                    return "block_kv_compute: the xla backend computes whole kv tiles"
                if self.backend != "xla" and value not in choices:
                    return f"block_kv_compute: {value} is not one of {choices}"
                continue
            if value not in choices:
                return f"{name}: {value!r} is not one of {choices}"
        if self.backend != "xla":
            try:
                config.check_tpu(self.workload.dtype)
            except ValueError as exc:
                return str(exc)
        if config.block_kv % config.block_kv_compute:
            return "block_kv_compute must divide block_kv"
        padding = self.padding(config)
        if padding > self.max_padding:
            return f"padding: {padding:.0%} extra tokens > {self.max_padding:.0%}"
        if self.backend != "xla":
            vmem = self.vmem_bytes(config)
            budget = VMEM_BUDGET_BYTES.get(self.workload.device_kind, DEFAULT_VMEM_BUDGET)
            if vmem > budget:
                return f"vmem: estimated {vmem / 2**20:.1f} MiB > {budget / 2**20:.0f} MiB budget"
            smem = self.smem_bytes(config)
            smem_budget = SMEM_BUDGET_OLD if self.workload.device_kind in ("TPU v2", "TPU v3") else SMEM_BUDGET_BYTES
            if smem > smem_budget:
                return f"smem: scalar-prefetched tables {smem / 2**10:.0f} KiB > {smem_budget / 2**10:.0f} KiB"
        return None

    def padding(self, config: TileConfig) -> float:
        """Extra slots over real tokens, as a fraction (alignment and tile rounding)."""
        _, _, tables, _ = prepare_group(self.pattern, [0], config)
        slots = max(tables.num_q_blocks * tables.block_q, tables.num_kv_blocks * tables.block_kv)
        return slots / self.pattern.seq_len - 1.0

    def vmem_bytes(self, config: TileConfig) -> int:
        """Estimated VMEM of one kernel call: double-buffered blocks, scratch, score tiles."""
        item = 2 if self.workload.dtype == "bfloat16" else 4
        d = self.workload.head_dim
        blocks = 2 * (config.block_q * d + 2 * config.block_kv * d) * item + 2 * config.block_q * d * item
        scratch = 2 * config.block_q * TPU_LANES * 4 + config.block_q * d * 4  # m, l lane-padded; acc
        scores = 3 * config.block_q * config.block_kv_compute * 4  # s, p and the partial-tile mask
        return blocks + scratch + scores

    def smem_bytes(self, config: TileConfig) -> int:
        """Bytes of scalar-prefetched tables of the largest kernel call of ``config``."""
        worst = 0
        for heads in head_groups(self.pattern, config):
            _, _, tables, params = prepare_group(self.pattern, heads, config)
            if config.variant == "compact":
                size = 2 * sum(t.num_tiles for t in tables.heads) * 4
            else:
                size = tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks * 4
            worst = max(worst, size + params.size * 4)
        return worst

    # ---------------------------------------------------------------- enumeration

    def candidates(self) -> Iterator[TileConfig]:
        """Every point of the grid, valid or not."""
        dims = self.dimensions()
        names = list(dims)
        for values in itertools.product(*(dims[n] for n in names)):
            params = dict(zip(names, values, strict=True))
            if params["block_kv_compute"] and params["block_kv"] % params["block_kv_compute"]:
                continue
            yield self.config_from(params)

    def enumerate(self) -> list[TileConfig]:
        """Every valid point (for exhaustive runs), in a stable order."""
        return [c for c in self.candidates() if self.violation(c) is None]

    def params_of(self, config: TileConfig) -> dict[str, Any]:
        """The sampler's params of a config (inverse of :meth:`config_from`)."""
        params = config.to_dict()
        if self.backend == "xla":
            params["block_kv_compute"] = 0
        return params
