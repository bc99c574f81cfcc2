"""The sandbox image's Dockerfile keeps its promises (no daemon here to build it: checked as text)."""

from __future__ import annotations

import json
import re

from retool.spec.names import SANDBOX_PORT
from tests.conftest import REPO

DOCKERFILE = (REPO / "images" / "sandbox" / "Dockerfile").read_text()


def test_runs_as_a_numeric_non_root_user() -> None:
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", DOCKERFILE, re.MULTILINE)
    assert users and all(int(uid) != 0 for uid, _gid in users)


def test_base_image_is_pinned_to_a_patch_version() -> None:
    (image,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image)


def test_installs_only_the_pinned_sandbox_extra() -> None:
    assert '".[sandbox]"' in DOCKERFILE
    block = re.search(r"^sandbox = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.MULTILINE | re.DOTALL)
    assert block is not None
    extras = re.findall(r'"([^"]+)"', block.group(1))
    assert all("==" in requirement for requirement in extras)
    assert {r.split("==")[0] for r in extras} >= {"numpy", "sympy", "scipy", "fastapi", "uvicorn", "pydantic-settings", "prometheus-client"}


def test_default_command_serves_on_the_sandbox_port() -> None:
    (cmd,) = re.findall(r"^CMD (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert json.loads(cmd)[:3] == ["retool", "sandbox", "serve"] and str(SANDBOX_PORT) in json.loads(cmd)
    assert f"EXPOSE {SANDBOX_PORT}" in DOCKERFILE


def test_build_context_is_limited_to_the_package() -> None:
    ignore = (REPO / "images" / "sandbox" / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1 :][:3] == ["!pyproject.toml", "!README.md", "!retool/"]
