"""The TPU memory budget of one kernel call: scoped VMEM per grid step and SMEM for the
scalar-prefetched tables, per chip generation.

The footprints come from the kernel itself (:func:`kernel.pallas_backend.vmem_bytes`
beside its BlockSpecs, :func:`kernel.pallas_backend.scalar_prefetch_bytes` beside
the arrays it prefetches), so a change of the kernel's blocks or tables changes
the budget check with it. They are estimates: Mosaic adds its own internal
scratch, and only a real compile says for sure.
"""

from __future__ import annotations

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.pallas_backend import scalar_prefetch_bytes, vmem_bytes
from kernel.pattern import SparsityPattern

# Scoped VMEM budget per TPU generation (keyed by the device_kind a TPU reports): what
# one kernel may use without raising Mosaic's default scoped limit (16 MiB up to v5,
# 32 MiB from v6e on); physical VMEM per core is larger (v4 16 MiB, v5e/v6e 128 MiB,
# v5p/v7 64 MiB).
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
SMEM_BUDGET_BYTES = 1 << 20  # 1 MiB per core from v4 on
OLD_SMEM_BUDGET_BYTES = 16 << 10  # v2 and v3
OLD_GENERATIONS = ("TPU v2", "TPU v3")


def vmem_budget(device_kind: str) -> int:
    return VMEM_BUDGET_BYTES.get(device_kind, DEFAULT_VMEM_BUDGET)


def smem_budget(device_kind: str) -> int:
    return OLD_SMEM_BUDGET_BYTES if device_kind in OLD_GENERATIONS else SMEM_BUDGET_BYTES


def config_vmem_bytes(config: TileConfig, head_dim: int, dtype: str) -> int:
    """Estimated VMEM of one grid step of ``config``'s kernel call."""
    itemsize = 2 if dtype == "bfloat16" else 4
    return vmem_bytes(config.block_q, config.block_kv, config.block_kv_compute, head_dim, itemsize)


def config_smem_bytes(pattern: SparsityPattern, config: TileConfig) -> int:
    """Bytes of scalar-prefetched tables of the largest kernel call of ``config`` (the block
    tables are built, and cached, as the call itself would build them)."""
    worst = 0
    for heads in head_groups(pattern, config):
        _, _, tables, params = prepare_group(pattern, heads, config)
        worst = max(worst, scalar_prefetch_bytes(tables, params, config.variant))
    return worst


def budget_violation(
    pattern: SparsityPattern, config: TileConfig, *, device_kind: str, head_dim: int, dtype: str
) -> str | None:
    """Why ``config`` does not fit the memory of ``device_kind``, or None."""
    vmem, vmem_limit = config_vmem_bytes(config, head_dim, dtype), vmem_budget(device_kind)
    if vmem > vmem_limit:
        return f"vmem: estimated {vmem / 2**20:.1f} MiB > {vmem_limit / 2**20:.0f} MiB budget"
    smem, smem_limit = config_smem_bytes(pattern, config), smem_budget(device_kind)
    if smem > smem_limit:
        return f"smem: scalar-prefetched tables {smem / 2**10:.0f} KiB > {smem_limit / 2**10:.0f} KiB"
    return None
