"""The library client: model code gets tuned tile configs without copying block sizes around.

::

    import autotune.client
    autotune.client.install()  # once, at start-up; reads the TILETUNE_* variables below
    out = sparse_attention(q, k, v, pattern)  # no config: resolved by the client at trace time

Resolution, once per (pattern, shape, backend, dtype) in a process:

1. in memory: a dict keyed by ``(id(pattern), shape, backend, dtype)`` (the entry
   holds the pattern, so an id is never reused while its entry lives). Under
   ``jax.jit`` the kernel calls the resolver only while tracing, so a compiled
   step does no lookup and no Python work at all.
2. on disk (``TILETUNE_CACHE_DIR``): one JSON file per (server, workload, software
   versions, snapshot), written to a temporary file and moved into place with
   ``os.replace``, so readers in other processes see a whole old file or a whole
   new one; a corrupt or partial file is ignored (and overwritten by the next answer).
3. the server's ``POST /v1/lookup`` (httpx): the whole server phase of a resolution
   (every attempt and the back-off between them) is bounded by
   ``TILETUNE_CLIENT_TIMEOUT``; connection errors, 5xx and malformed answers are
   retried (``TILETUNE_CLIENT_RETRIES``) inside that budget; after
   ``TILETUNE_BREAKER_FAILURES`` failed lookups in a row a circuit breaker stops
   calling the server for ``TILETUNE_BREAKER_COOLDOWN`` seconds, then lets one
   lookup through to probe it.
4. the kernel's heuristic (:func:`kernel.heuristic.heuristic_config`), or an
   expired disk entry if there is one, when the server cannot be asked. Such a
   fallback is retried in this process after the breaker's cool-down, and never
   written to disk.

What is kept on disk, and for how long:

- answers pinned to a snapshot: forever (an answer at a snapshot never changes);
- ``tuned`` answers: ``TILETUNE_CACHE_TTL`` seconds (default one day), so a
  re-tuned config is picked up by the next day's runs;
- ``stale``, ``nearest`` and ``heuristic`` answers of the server: only
  ``TILETUNE_CACHE_MISS_TTL`` seconds (default 10 minutes), so a tuning job that
  lands is picked up by the next run after it. These are used from disk only
  under the ``heuristic`` miss policy;
- an expired entry is not deleted: when the server cannot be reached it is still
  a better answer than the heuristic.

Miss policies (``TILETUNE_MISS_POLICY``), for answers other than ``tuned``:

- ``heuristic`` (default): use the server's answer at once (its ``stale``,
  ``nearest`` or ``heuristic`` config). With a writer token (``TILETUNE_TOKEN``)
  the lookup asks the server to queue a tuning job (``enqueue``); without one it
  only looks up.
- ``wait``: block up to ``TILETUNE_WAIT_TIMEOUT`` seconds while the queued job runs
  (polling ``GET /v1/jobs/{id}``), then use the tuned config; if none came (job
  failed, timed out, or no job could be queued because there is no writer
  token), ``TILETUNE_WAIT_FALLBACK`` decides: ``heuristic`` uses the server's
  untuned answer, ``error`` raises :class:`ConfigMissError`.
- ``error``: raise :class:`ConfigMissError` unless the answer is a tuned config of
  this workload (``tuned``, or ``stale``: tuned under other software versions),
  also when the server cannot be reached and nothing usable is cached.

Snapshots: every answer carries the server's ``snapshot`` (the highest tuned-config
id when it was read). ``TILETUNE_SNAPSHOT=S`` pins the client: every lookup is
answered as of S, so all hosts of a multi-host job resolve the same configs while
new tunings land. Get S from any answer (``tiletune lookup ... --json``, or
:attr:`TileClient.last_snapshot`) and give it to every host.

This module imports httpx and the kernel (jax, numpy) only: never SQLAlchemy,
FastAPI, Optuna or uvicorn, because it runs inside inference and training jobs.
"""

from __future__ import annotations

import threading
from typing import Any

from autotune.client.breaker import CircuitBreaker
from autotune.client.cache import Answer, DiskCache
from autotune.client.settings import (
    ENVIRONMENT,
    MISS_POLICIES,
    ClientConfigError,
    ClientSettings,
    ConfigMissError,
    default_cache_dir,
)
from autotune.client.tile_client import TileClient

__all__ = [
    "ENVIRONMENT",
    "MISS_POLICIES",
    "Answer",
    "CircuitBreaker",
    "ClientConfigError",
    "ClientSettings",
    "ConfigMissError",
    "DiskCache",
    "TileClient",
    "default_cache_dir",
    "install",
    "installed",
    "uninstall",
]

_installed: TileClient | None = None
_install_lock = threading.Lock()


def install(client: TileClient | None = None, **options: Any) -> TileClient:
    """Make ``sparse_attention`` calls without a config use the tiletune client.

    ``client`` or a new one from the ``TILETUNE_*`` variables, with ``options``
    (fields of :class:`ClientSettings`) taking precedence. Replaces (and closes) a
    previously installed client. Returns the installed client.
    """
    from kernel.attention import set_config_resolver

    global _installed
    if client is not None and options:
        raise TypeError("give either a client or options, not both")
    new = client if client is not None else TileClient.from_env(**options)
    with _install_lock:
        old, _installed = _installed, new
        set_config_resolver(new.resolve)
    if old is not None and old is not new:
        old.close()
    return new


def uninstall() -> None:
    """Back to the kernel's heuristic for calls without a config."""
    from kernel.attention import set_config_resolver

    global _installed
    with _install_lock:
        old, _installed = _installed, None
        set_config_resolver(None)
    if old is not None:
        old.close()


def installed() -> TileClient | None:
    """The installed client, if any."""
    return _installed
