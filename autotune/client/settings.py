"""Client settings: keyword arguments, or ``TILETUNE_*`` environment variables read by pydantic-settings.

``ClientSettings(**options)`` takes its options only (model code that builds a
client explicitly gets exactly what it asked for); :meth:`ClientSettings.from_env`
reads the variables (documented in the README's "The client" section) and lets
keyword options override them. An invalid value raises :class:`ClientConfigError`
naming the variable, or the option when it was passed as an argument.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

MissPolicy = Literal["heuristic", "wait", "error"]
WaitFallback = Literal["heuristic", "error"]
MISS_POLICIES: tuple[str, ...] = get_args(MissPolicy)
WAIT_FALLBACKS: tuple[str, ...] = get_args(WaitFallback)
PREFIX = "TILETUNE_"


class ClientConfigError(ValueError):
    """A client setting (argument or TILETUNE_* variable) is invalid; the message names it."""


class ConfigMissError(RuntimeError):
    """No tuned config for a workload under the ``error`` miss policy (or ``wait`` with ``error`` fallback)."""


def _variable(name: str) -> Any:
    """A field read from the variable ``TILETUNE_<name>``; its own name stays the keyword option.
    Every field names its variable this way, so an error says which of the two was wrong."""
    return AliasChoices(PREFIX + name)


class ClientSettings(BaseSettings):
    """Every setting of the client; :meth:`from_env` reads them from ``TILETUNE_*`` variables."""

    model_config = SettingsConfigDict(frozen=True, populate_by_name=True, extra="forbid", env_ignore_empty=True)

    server_url: str | None = Field(None, validation_alias=_variable("SERVER_URL"))
    token: str | None = Field(None, validation_alias=_variable("TOKEN"))
    timeout_s: float = Field(2.0, gt=0, validation_alias=_variable("CLIENT_TIMEOUT"))
    retries: int = Field(2, ge=0, validation_alias=_variable("CLIENT_RETRIES"))
    cache_dir: Path | None = Field(None, validation_alias=_variable("CACHE_DIR"))  # "none" or "off": no disk cache
    cache_ttl_s: float = Field(86400.0, ge=0, validation_alias=_variable("CACHE_TTL"))
    miss_ttl_s: float = Field(600.0, ge=0, validation_alias=_variable("CACHE_MISS_TTL"))
    miss_policy: MissPolicy = Field("heuristic", validation_alias=_variable("MISS_POLICY"))
    wait_timeout_s: float = Field(600.0, gt=0, validation_alias=_variable("WAIT_TIMEOUT"))
    wait_fallback: WaitFallback = Field("heuristic", validation_alias=_variable("WAIT_FALLBACK"))
    wait_poll_s: float = Field(1.0, gt=0, validation_alias=_variable("WAIT_POLL"))
    snapshot: int | None = Field(None, ge=0, validation_alias=_variable("SNAPSHOT"))
    enqueue: bool = Field(True, validation_alias=_variable("ENQUEUE"))
    breaker_failures: int = Field(3, ge=1, validation_alias=_variable("BREAKER_FAILURES"))
    breaker_cooldown_s: float = Field(30.0, gt=0, validation_alias=_variable("BREAKER_COOLDOWN"))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Options only: the environment is read by :meth:`from_env`, on request."""
        return (init_settings,)

    def __init__(self, **options: Any) -> None:
        try:
            super().__init__(**options)
        except ValidationError as exc:
            raise ClientConfigError(_describe(exc)) from None

    @field_validator("server_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = value.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url

    @field_validator("token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return value if value is not None and value.strip() else None

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _cache_dir(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("none", "off"):
            return None
        return Path(value).expanduser() if isinstance(value, str | Path) else value

    @field_validator("timeout_s", "cache_ttl_s", "miss_ttl_s", "wait_timeout_s", "wait_poll_s", "breaker_cooldown_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("retries", "breaker_failures", "snapshot", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # True is an int to Python, never a count here
            raise ValueError("must be an integer")
        return value

    @classmethod
    def from_env(cls, **overrides: Any) -> ClientSettings:
        """Settings from the ``TILETUNE_*`` variables (see :data:`ENVIRONMENT`); keyword options win.
        Without ``TILETUNE_CACHE_DIR`` the disk cache is :func:`default_cache_dir`."""
        found = {var: raw for var, raw in EnvSettingsSource(cls)().items() if ENVIRONMENT[var] not in overrides}
        if "TILETUNE_CACHE_DIR" not in found and "cache_dir" not in overrides:
            found["cache_dir"] = default_cache_dir()
        return cls(**found, **overrides)


def _describe(exc: ValidationError) -> str:
    """One line per invalid setting, each naming what it came in as: the variable, or the option."""
    parts = []
    for error in exc.errors():
        key = str(error["loc"][0]) if error["loc"] else "settings"
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {message} (got {error.get('input')!r})")
    return "; ".join(parts)


def _variables() -> dict[str, str]:
    """Field name -> its TILETUNE_* variable."""
    out = {}
    for name, field in ClientSettings.model_fields.items():
        assert isinstance(field.validation_alias, AliasChoices)
        out[name] = str(field.validation_alias.choices[0])
    return out


ENVIRONMENT_OF: dict[str, str] = _variables()
# variable -> setting, for the README's table and for error messages.
ENVIRONMENT: dict[str, str] = {var: name for name, var in ENVIRONMENT_OF.items()}


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/tiletune``, else ``~/.cache/tiletune``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiletune"
