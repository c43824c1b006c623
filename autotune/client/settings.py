"""Client settings: keyword arguments or ``TILETUNE_*`` environment variables."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

MissPolicy = Literal["heuristic", "wait", "error"]
WaitFallback = Literal["heuristic", "error"]
MISS_POLICIES: tuple[str, ...] = ("heuristic", "wait", "error")
WAIT_FALLBACKS: tuple[str, ...] = ("heuristic", "error")


class ClientConfigError(ValueError):
    """A client setting (argument or TILETUNE_* variable) is invalid; the message names it."""


class ConfigMissError(RuntimeError):
    """No tuned config for a workload under the ``error`` miss policy (or ``wait`` with ``error`` fallback)."""


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """Every setting of the client; :meth:`from_env` reads them from ``TILETUNE_*`` variables."""

    server_url: str | None = None
    token: str | None = None
    timeout_s: float = 2.0
    retries: int = 2
    cache_dir: Path | None = None
    cache_ttl_s: float = 86400.0
    miss_ttl_s: float = 600.0
    miss_policy: MissPolicy = "heuristic"
    wait_timeout_s: float = 600.0
    wait_fallback: WaitFallback = "heuristic"
    wait_poll_s: float = 1.0
    snapshot: int | None = None
    enqueue: bool = True
    breaker_failures: int = 3
    breaker_cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.server_url is not None:
            url = self.server_url.strip().rstrip("/")
            if not url.startswith(("http://", "https://")):
                raise ClientConfigError(f"server_url must start with http:// or https://, got {self.server_url!r}")
            object.__setattr__(self, "server_url", url)
        if self.token is not None and not self.token.strip():
            object.__setattr__(self, "token", None)
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        for name in ("timeout_s", "wait_timeout_s", "wait_poll_s", "breaker_cooldown_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ClientConfigError(f"{name} must be a number > 0, got {value!r}")
        for name in ("cache_ttl_s", "miss_ttl_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ClientConfigError(f"{name} must be a number >= 0, got {value!r}")
        for name, low in (("retries", 0), ("breaker_failures", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ClientConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.miss_policy not in MISS_POLICIES:
            raise ClientConfigError(f"miss_policy must be one of {MISS_POLICIES}, got {self.miss_policy!r}")
        if self.wait_fallback not in WAIT_FALLBACKS:
            raise ClientConfigError(f"wait_fallback must be one of {WAIT_FALLBACKS}, got {self.wait_fallback!r}")
        if self.snapshot is not None and (
            not isinstance(self.snapshot, int) or isinstance(self.snapshot, bool) or self.snapshot < 0
        ):
            raise ClientConfigError(f"snapshot must be an integer >= 0, got {self.snapshot!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ClientSettings:
        """Settings from ``TILETUNE_*`` variables (see :data:`ENVIRONMENT`); keyword arguments win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"cache_dir": default_cache_dir(env)}
        for var, (name, parse) in ENVIRONMENT.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = parse(raw.strip())
            except ValueError as exc:
                raise ClientConfigError(f"{var}: {exc}") from None
        values.update(overrides)
        try:
            return cls(**values)
        except ClientConfigError as exc:
            names = {name: var for var, (name, _) in ENVIRONMENT.items()}
            field = str(exc).split(" ", 1)[0]
            if field in names and field not in overrides:
                raise ClientConfigError(f"{names[field]}: {exc}") from None
            raise


def _float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"expected an integer, got {raw!r}") from None


def _bool(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _cache_dir(raw: str) -> Path | None:
    return None if raw.lower() in ("none", "off") else Path(raw)


def _str(raw: str) -> str:
    return raw


# variable -> (setting, parser). Documented in the README's "The client" section.
ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any]]] = {
    "TILETUNE_SERVER_URL": ("server_url", _str),
    "TILETUNE_TOKEN": ("token", _str),
    "TILETUNE_CLIENT_TIMEOUT": ("timeout_s", _float),
    "TILETUNE_CLIENT_RETRIES": ("retries", _int),
    "TILETUNE_CACHE_DIR": ("cache_dir", _cache_dir),
    "TILETUNE_CACHE_TTL": ("cache_ttl_s", _float),
    "TILETUNE_CACHE_MISS_TTL": ("miss_ttl_s", _float),
    "TILETUNE_MISS_POLICY": ("miss_policy", _str),
    "TILETUNE_WAIT_TIMEOUT": ("wait_timeout_s", _float),
    "TILETUNE_WAIT_FALLBACK": ("wait_fallback", _str),
    "TILETUNE_SNAPSHOT": ("snapshot", _int),
    "TILETUNE_ENQUEUE": ("enqueue", _bool),
    "TILETUNE_BREAKER_FAILURES": ("breaker_failures", _int),
    "TILETUNE_BREAKER_COOLDOWN": ("breaker_cooldown_s", _float),
}


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/tiletune``, else ``~/.cache/tiletune``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiletune"
