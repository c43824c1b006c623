"""The software versions recorded with every result and sent with every lookup.

Kept apart from :mod:`server.worker.tune` so the library client can read them without
importing the search (Optuna) or the service (SQLAlchemy).
"""

from __future__ import annotations


def software_versions(backend: str) -> dict[str, str | None]:
    """jax, jaxlib and libtpu versions of results on ``backend``.

    libtpu is the TPU runtime and compiler: it decides ``tpu`` results only, so it is
    recorded (and compared) for the ``tpu`` backend alone, and None otherwise. A CPU
    result from a machine that happens to have the tpu extra installed is then the
    same result as one from a machine without it, and is not served as stale to either.
    """
    from importlib import metadata

    import jax
    import jaxlib

    libtpu = None
    for dist in ("libtpu", "libtpu-nightly") if backend == "tpu" else ():
        try:
            libtpu = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu}
