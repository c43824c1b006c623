"""Workload: everything the best tile config depends on, with a stable key.

A workload is the device kind, backend, dtype, batch, head_dim, the
SparsityPattern (which fixes heads and sequence length) and the kernel's
version. Software versions (jax, jaxlib, libtpu) are *not* part of it: a result
measured under other versions is still served, marked stale.

This module owns the one JSON form of a workload: :meth:`Workload.canonical`
writes it (the API's workload object, the stored spec, the client's lookup body
and a recorded table's header are all this form) and :meth:`Workload.from_dict`
reads it, also in the ``preset`` shorthand the API accepts. The key of a
workload is a hash of the canonical form (:data:`KEY_PATTERN`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from typing import Any, Literal, get_args

from kernel.pattern import SparsityPattern

# The concrete backends a workload is tuned and served for (the kernel also takes
# "auto", which resolves to one of these on the machine at hand).
Backend = Literal["tpu", "xla", "interpret"]
BACKENDS: tuple[str, ...] = get_args(Backend)

# The kernel's version, per backend. Bump a backend's version when a change to the
# code it runs can change which config is fastest there: its tuned results of
# another version then belong to another workload key, and the other backends'
# keys stay. ``tpu`` and ``interpret`` run the one Pallas kernel.
# xla 2: a walk splits its rows into scans by list length (kernel.xla_backend.scan_plan).
KERNEL_VERSIONS: dict[str, str] = {"tpu": "1", "interpret": "1", "xla": "2"}
Dtype = Literal["float32", "bfloat16"]
DTYPES: tuple[str, ...] = get_args(Dtype)
MAX_BATCH = 4096
MAX_HEAD_DIM = 1024
KEY_PATTERN = r"^[0-9a-f]{32}$"  # Workload.key: the first 32 hex digits of a SHA-256
KEY_RE = re.compile(KEY_PATTERN)


@dataclasses.dataclass(frozen=True)
class Workload:
    device_kind: str
    backend: str
    dtype: str
    batch: int
    head_dim: int
    pattern: SparsityPattern
    kernel_version: str = ""  # empty: the backend's current version (KERNEL_VERSIONS)

    def __post_init__(self) -> None:
        if not isinstance(self.device_kind, str) or not self.device_kind.strip() or len(self.device_kind) > 64:
            raise ValueError("device_kind must be a non-empty string of at most 64 characters")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.kernel_version:
            object.__setattr__(self, "kernel_version", KERNEL_VERSIONS[self.backend])
        if not isinstance(self.kernel_version, str):
            raise ValueError(f"kernel_version must be a string, got {self.kernel_version!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name, hi in (("batch", MAX_BATCH), ("head_dim", MAX_HEAD_DIM)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ValueError(f"{name} must be an integer in [1, {hi}], got {value!r}")

    @property
    def heads(self) -> int:
        return self.pattern.num_heads

    @property
    def family(self) -> str:
        """What must match for a tuned config to be a sensible neighbour: the head
        kinds with their sink flags (as a set), whether text is present and where."""
        kinds = sorted({h.kind + ("+sink" if h.first_frame_sink else "") for h in self.pattern.heads})
        lay = self.pattern.layout
        text = f"text-{lay.text_position}" if lay.text_tokens else "no-text"
        return f"{self.dtype}|{','.join(kinds)}|{text}"

    def canonical(self) -> dict[str, Any]:
        """The workload's one JSON form (see the module docstring); its hash is :attr:`key`."""
        return {
            "device_kind": self.device_kind,
            "backend": self.backend,
            "dtype": self.dtype,
            "batch": self.batch,
            "head_dim": self.head_dim,
            "pattern": self.pattern.canonical(),
            "kernel_version": self.kernel_version,
        }

    @functools.cached_property  # frozen: computed once (a lookup asks for it several times)
    def key(self) -> str:
        """Stable hash of the canonical form: equal workloads have equal keys."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """A workload from its JSON form: the canonical one, or with ``"preset": NAME``
        instead of ``pattern`` (the preset's pattern at ``heads`` heads, default its
        heads per chip; ``head_dim`` defaults to the preset's). ``heads`` and
        ``seq_len``, when given, are checked against the pattern. Errors name the field."""
        from kernel.presets import PRESETS, get_preset

        known = {"device_kind", "backend", "dtype", "batch", "head_dim", "pattern", "preset", "heads", "seq_len"}
        unknown = set(data) - known - {"kernel_version"}
        if unknown:
            raise ValueError(f"workload: unknown field(s) {sorted(unknown)}")
        missing = {"device_kind", "backend", "dtype", "batch"} - set(data)
        if missing:
            raise ValueError(f"workload: missing field(s) {sorted(missing)}")
        if ("pattern" in data) == ("preset" in data):
            raise ValueError("give exactly one of 'pattern' or 'preset'")
        head_dim = data.get("head_dim")
        heads = data.get("heads")
        if "preset" in data:
            name = data["preset"]
            if name not in PRESETS:
                raise ValueError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
            preset = get_preset(name)
            pattern = preset.pattern(heads)
            head_dim = head_dim or preset.head_dim
        else:
            pattern = SparsityPattern.from_dict(data["pattern"])
        if head_dim is None:
            raise ValueError("head_dim: required when no preset is given")
        if heads is not None and heads != pattern.num_heads:
            raise ValueError(f"heads: {heads} != the pattern's {pattern.num_heads} heads")
        seq_len = data.get("seq_len")
        if seq_len is not None and seq_len != pattern.seq_len:
            raise ValueError(f"seq_len: {seq_len} != frames*tokens_per_frame + text_tokens = {pattern.seq_len}")
        return cls(
            data["device_kind"],
            data["backend"],
            data["dtype"],
            data["batch"],
            head_dim,
            pattern,
            data.get("kernel_version", ""),
        )

    def features(self) -> dict[str, float]:
        """The numbers the nearest-neighbour distance compares (stored as columns)."""
        lay = self.pattern.layout
        windows = [h.window for h in self.pattern.heads]
        return {
            "frames": lay.frames,
            "tokens_per_frame": lay.tokens_per_frame,
            "text_tokens": lay.text_tokens,
            "heads": self.heads,
            "head_dim": self.head_dim,
            "batch": self.batch,
            "mean_window": sum(windows) / len(windows),
        }

    def distance(self, other: Workload) -> float:
        """Dissimilarity of two workloads of one family (see :func:`feature_distance`)."""
        return feature_distance(self.features(), other.features())


FEATURES = ("frames", "tokens_per_frame", "text_tokens", "heads", "head_dim", "batch", "mean_window")


def feature_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Sum over the features of |log((x + 1) / (y + 1))|: scale-free, 0 for equal workloads."""
    return round(sum(abs(math.log((a[f] + 1.0) / (b[f] + 1.0))) for f in FEATURES), 6)
