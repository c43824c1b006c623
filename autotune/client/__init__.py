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
   new one. Anything but a regular file of at most 64 KB is never read (a FIFO
   would block the reader forever), and a corrupt, partial or malformed entry is
   ignored; both are replaced by the next answer.
3. the server's ``POST /v1/lookup`` (httpx), under one wall-clock deadline of
   ``TILETUNE_CLIENT_TIMEOUT`` seconds per resolution: connecting (name lookup
   included), sending, reading the answer however slowly it arrives, every retry
   and the back-off between them. Each request runs in a thread that the
   resolution abandons at the deadline (:mod:`autotune.client.exchange`), so the
   deadline holds whatever the network does; the heuristic follows within a few
   milliseconds. Connection errors, 5xx and unparsable answers are retried
   (``TILETUNE_CLIENT_RETRIES``) before the deadline; after
   ``TILETUNE_BREAKER_FAILURES`` failed lookups in a row a circuit breaker stops
   calling the server for ``TILETUNE_BREAKER_COOLDOWN`` seconds, then lets one
   lookup through to probe it.
4. the kernel's heuristic (:func:`kernel.heuristic.heuristic_config`), or an
   expired disk entry if there is one, when the server cannot be asked. Such a
   fallback is retried in this process after the breaker's cool-down, and never
   written to disk.

Everything the server or the disk says is checked before use
(:mod:`autotune.client.answer`): a JSON object of at most 64 KB, each field the
client reads of the right type and range (``source`` one of the four, ``snapshot``
>= 0 and, when pinned, the pinned one; ``config_id`` and ``job_id`` >= 1;
``config_id`` <= ``snapshot``), and a config usable for the call's sequence,
backend and dtype (:meth:`kernel.config.TileConfig.check_usable`: no tile larger
than the smallest power of two covering the sequence, the TPU tiling rules on
``tpu`` and ``interpret``). An answer that fails is a failed lookup (the fallback
above, logged once, asked again after the cool-down); a cache entry that fails is
absent. Nothing they say raises out of :meth:`TileClient.resolve` but
:class:`ConfigMissError` under the ``error`` policies.

What is kept on disk, and for how long (every entry has a finite ``expires_at``,
and is fresh until then but never longer than the TTL in force from now):

- ``tuned`` answers: ``TILETUNE_CACHE_TTL`` seconds (default one day), so a
  re-tuned config is picked up by the next day's runs;
- answers pinned to a snapshot, whatever their source: ``TILETUNE_CACHE_TTL``
  too (an answer at a snapshot never changes, so asking again costs one lookup
  and gives the same answer). Entries that clients before this rule wrote with no
  expiry (``null``) read as expired;
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
  (polling ``GET /v1/jobs/{id}``, each poll ending by the timeout and by the end of
  the wait), then use the tuned config (looked up with a timeout of its own, so a
  resolution takes at most timeout + wait + timeout); if none came (job
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

from autotune.client.answer import Answer
from autotune.client.breaker import CircuitBreaker
from autotune.client.cache import DiskCache
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
