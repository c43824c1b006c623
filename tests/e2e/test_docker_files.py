"""What can be checked of docker/ without a Docker engine (none runs on these machines):
the compose file parses and names files that exist, the images copy files that exist and
install what pyproject.toml declares, and their commands are real tiletune commands."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from typer.testing import CliRunner

from server.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def dockerfiles() -> list[Path]:
    return sorted(DOCKER.glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def project_requirement(name: str) -> Requirement:
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        if req.name == name:
            return req
    raise AssertionError(f"{name} is not a dependency in pyproject.toml")


def test_compose_parses_and_names_files_that_exist() -> None:
    services = compose()["services"]
    assert {"postgres", "migrate", "server", "dashboard"} <= set(services)
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            assert "image" in service, name
            continue
        context = (DOCKER / build["context"]).resolve()
        assert context == ROOT, f"{name}: the build context is the repository root"
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} does not exist"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            assert condition["condition"] in ("service_healthy", "service_completed_successfully", "service_started")
    assert services["migrate"]["command"][:3] == ["tiletune", "db", "upgrade"]
    # One dead process must not take the service down: the long-running ones come back by themselves,
    # the one-shot migration does not run again.
    assert {name: service.get("restart") for name, service in services.items()} == {
        "postgres": "unless-stopped",
        "migrate": "no",
        "server": "unless-stopped",
        "dashboard": "unless-stopped",
    }
    assert services["server"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    urls = {services[s]["environment"].get("TILETUNE_DATABASE_URL") for s in ("migrate", "server")}
    assert len(urls) == 1 and urls.pop() == services["dashboard"]["environment"]["OPTUNA_STORAGE"], (
        "the server, the migrations and optuna-dashboard share one database"
    )


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_images_copy_files_that_exist_and_match_pyproject(path: Path) -> None:
    steps = instructions(path)
    base = next(arg for word, arg in steps if word == "FROM")
    python = re.match(r"python:(\d+\.\d+)", base)
    assert python, f"{path.name}: base image {base!r} is not a python image"
    assert Version(python.group(1) + ".0") in SpecifierSet(PYPROJECT["project"]["requires-python"])
    for word, arg in steps:
        if word == "COPY":
            *sources, _dest = shlex.split(arg)
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source} does not exist"
    installs = [shlex.split(arg) for word, arg in steps if word == "RUN" and "pip install" in arg]
    assert installs, f"{path.name} installs nothing"
    for argv in installs:
        targets = [a for a in argv[argv.index("install") + 1 :] if not a.startswith("-")]
        for target in targets:
            if target.startswith("."):  # the project itself, with its extras
                extras = re.findall(r"\[([^\]]+)\]", target)
                for extra in (e.strip() for group in extras for e in group.split(",")):
                    assert extra in PYPROJECT["project"]["optional-dependencies"], f"{path.name}: no extra {extra}"
                assert (ROOT / "pyproject.toml").is_file()
                continue
            req = Requirement(target)
            if req.name in ("optuna", "psycopg"):  # the image talks to the same database as the project
                ours = project_requirement(req.name)
                assert str(req.specifier) == str(ours.specifier), f"{path.name}: {req} differs from pyproject's {ours}"


def test_worker_image_installs_the_tpu_extra_pinned_to_the_projects_jax() -> None:
    steps = instructions(DOCKER / "worker-tpu.Dockerfile")
    assert any(word == "RUN" and "'.[tpu]'" in arg for word, arg in steps)
    (tpu,) = (Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["tpu"])
    assert tpu.name == "jax" and "tpu" in tpu.extras
    assert tpu.specifier == project_requirement("jax").specifier


def image_command(path: Path) -> list[str]:
    cmd = next(arg for word, arg in instructions(path) if word == "CMD")
    argv = yaml.safe_load(cmd)  # the JSON (exec) form
    assert isinstance(argv, list)
    return [str(a) for a in argv]


def commands() -> list[list[str]]:
    services = compose()["services"]
    found = [services[s]["command"] for s in ("migrate", "server")]
    found += [image_command(DOCKER / name) for name in ("server.Dockerfile", "worker-tpu.Dockerfile")]
    return found


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:3]))
def test_commands_are_real_tiletune_commands(argv: list[str]) -> None:
    assert argv[0] == "tiletune"
    words = [a for a in argv[1:] if not a.startswith("-")]
    options = [a for a in argv[1:] if a.startswith("--")]
    depth = 2 if words[0] in ("db", "token", "bench") else 1
    result = CliRunner().invoke(cli, [*words[:depth], "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for option in options:
        assert option in result.output, f"tiletune {' '.join(words[:depth])} has no {option}"
