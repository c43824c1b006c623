"""libtpu is recorded with ``tpu`` results only: a CPU result is the same whether or not the tpu extra
is installed beside it, so it is never served as stale because of it."""

from __future__ import annotations

from importlib import metadata

import jax
import jaxlib
import pytest

from autotune.versions import software_versions


@pytest.fixture
def libtpu_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version

    def version(dist: str) -> str:
        return "0.0.99" if dist == "libtpu" else real(dist)

    monkeypatch.setattr(metadata, "version", version)


@pytest.mark.usefixtures("libtpu_installed")
def test_libtpu_is_recorded_for_the_tpu_backend_only() -> None:
    jax_versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    assert software_versions("tpu") == {**jax_versions, "libtpu": "0.0.99"}
    for backend in ("xla", "interpret"):
        assert software_versions(backend) == {**jax_versions, "libtpu": None}
