"""The TPU memory budget of one kernel call: scoped VMEM per grid step and SMEM for the
scalar-prefetched tables, per chip generation.

The footprints come from the kernel itself (:func:`kernel.pallas_backend.vmem_bytes`
beside its BlockSpecs, :func:`kernel.pallas_backend.scalar_prefetch_sizes` beside
the arrays it prefetches), so a change of the kernel's blocks or tables changes
the budget check with it. They are estimates: Mosaic adds its own internal
scratch, and only a real compile says for sure. The SMEM estimate includes what
the compiler was measured to add (:data:`SMEM_ALLOCATION_BYTES`, :func:`smem_reserve`).
"""

from __future__ import annotations

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.pallas_backend import scalar_prefetch_sizes, vmem_bytes
from kernel.pattern import SparsityPattern
from kernel.placement import round_up

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
# What the TPU compiler adds to the scalar-prefetched arrays in SMEM, measured with jax/jaxlib
# 0.10.2 and libtpu 0.0.42.1 on the compile-only targets of kernel.tpu_targets, by compiling
# single calls whose tables sit 0-4.5 KiB under 1 MiB in 512-byte steps (naive, split and compact;
# 1-7 heads; q 128-512 x kv 128-256), and over the presets' spaces (tiletune bench compile):
#  - XLA allocates each prefetched array rounded up to 512 bytes (its own message for
#    hunyuan-720p's 1,132,096-byte naive table: "Allocation (size=1132544) would exceed memory");
#  - on v5e, v5p, v6e and TPU7x a call compiles iff the rounded arrays leave at least 3 KiB of the
#    1 MiB: 2,560 bytes left fails ("Ran out of memory in memory space smem. Used 1.00M of 1.00M
#    smem"), 3,072 left compiles; on v4, 1,024 left fails and 1,536 compiles.
# The estimate before these reserves (raw bytes <= 1 MiB) called a table up to about 3.5 KiB under
# 1 MiB valid that the compiler refuses (a test of the budget pins one). No config of the
# presets' spaces lies in that band (the tightest that compiled left 3,584 bytes), so the reserves
# refuse nothing there that compiles. Other device kinds get the larger reserve.
SMEM_ALLOCATION_BYTES = 512
SMEM_RESERVE_BYTES: dict[str, int] = {"TPU v4": 1536}
DEFAULT_SMEM_RESERVE_BYTES = 3 << 10


def vmem_budget(device_kind: str) -> int:
    return VMEM_BUDGET_BYTES.get(device_kind, DEFAULT_VMEM_BUDGET)


def smem_budget(device_kind: str) -> int:
    return OLD_SMEM_BUDGET_BYTES if device_kind in OLD_GENERATIONS else SMEM_BUDGET_BYTES


def smem_reserve(device_kind: str) -> int:
    """SMEM the compiler needs beside the prefetched arrays on ``device_kind`` (measured above)."""
    return SMEM_RESERVE_BYTES.get(device_kind, DEFAULT_SMEM_RESERVE_BYTES)


def config_vmem_bytes(config: TileConfig, head_dim: int, dtype: str) -> int:
    """Estimated VMEM of one grid step of ``config``'s kernel call."""
    itemsize = 2 if dtype == "bfloat16" else 4
    return vmem_bytes(config.block_q, config.block_kv, config.block_kv_compute, head_dim, itemsize)


def config_smem_bytes(pattern: SparsityPattern, config: TileConfig) -> int:
    """SMEM of the scalar-prefetched arrays of the largest kernel call of ``config``, each rounded
    up to the compiler's :data:`SMEM_ALLOCATION_BYTES` (the block tables are built, and cached, as
    the call itself would build them)."""
    worst = 0
    for heads in head_groups(pattern, config):
        _, _, tables, params = prepare_group(pattern, heads, config)
        sizes = scalar_prefetch_sizes(tables, params, config.variant)
        worst = max(worst, sum(round_up(size, SMEM_ALLOCATION_BYTES) for size in sizes))
    return worst


def budget_violation(
    pattern: SparsityPattern, config: TileConfig, *, device_kind: str, head_dim: int, dtype: str
) -> str | None:
    """Why ``config`` does not fit the memory of ``device_kind``, or None."""
    vmem, vmem_limit = config_vmem_bytes(config, head_dim, dtype), vmem_budget(device_kind)
    if vmem > vmem_limit:
        return f"vmem: estimated {vmem / 2**20:.1f} MiB > {vmem_limit / 2**20:.0f} MiB budget"
    smem, reserve, smem_limit = config_smem_bytes(pattern, config), smem_reserve(device_kind), smem_budget(device_kind)
    if smem + reserve > smem_limit:
        return (
            f"smem: scalar-prefetched tables {smem / 2**10:.1f} KiB + the compiler's {reserve / 2**10:.1f} KiB "
            f"> {smem_limit / 2**10:.0f} KiB"
        )
    return None
