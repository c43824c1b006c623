"""The software versions recorded with every result and sent with every lookup.

Kept apart from :mod:`server.worker.tune` so the library client can read them without
importing the search (Optuna) or the service (SQLAlchemy).
"""

from __future__ import annotations


def software_versions() -> dict[str, str | None]:
    """jax, jaxlib and libtpu versions (libtpu None when it is not installed)."""
    from importlib import metadata

    import jax
    import jaxlib

    libtpu = None
    for dist in ("libtpu", "libtpu-nightly"):
        try:
            libtpu = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu}
