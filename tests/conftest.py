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


SAME_WORKER: dict[str, str] = {
    path: "operator-cluster"
    for path in (
        "tests/operator/test_integration.py",
        "tests/operator/test_integration_cluster.py",
        "tests/operator/test_integration_isolation.py",
        "tests/operator/test_integration_tracking.py",
        "tests/operator/test_preflight_stage.py",
        "tests/operator/test_zz_rbac.py",
    )
}
"""Test files that must share one process: the operator's emulator modules record every request the
operator makes, and test_zz_rbac (last in the group) checks the grants against all of them."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist with ``--dist loadgroup`` (``make test``) every test file runs whole on one
    worker, so its module-scoped servers start once, and ``SAME_WORKER`` files share one. Without
    xdist the marks are inert."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(SAME_WORKER.get(path, path)))
