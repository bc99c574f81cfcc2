"""Shared test helpers: paths, and an environment for subprocesses that import this checkout."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("retoolrun-*.yaml"))
SHARED = REPO.parent / "shared"
KUBERAY_SCHEMAS = SHARED / "schemas" / "kuberay-v1.7.0"


def repo_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that must import this checkout's code first."""
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "operator")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def python() -> str:
    return sys.executable
