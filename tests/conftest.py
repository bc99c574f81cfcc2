"""Shared test helpers: paths, and an environment for subprocesses that import this checkout."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from retool.embedded.process import free_port as free_port  # the tests' servers pick ports as the product's do
from upstream.pins import kuberay_crd_dir

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("retoolrun-*.yaml"))
OPERATOR_OF_EXAMPLE = {"retoolrun-qwen32b-volcano": ("--batch-scheduler", "volcano")}
"""Flags of `retool validate` / `retool render --manifests` naming the operator an example is written
for (its header says how that operator is installed); the others are for the chart's defaults."""
KUBERAY_SCHEMAS = kuberay_crd_dir(REPO)
"""KubeRay's CRDs at the pinned version, fetched from its Go module by `make kuberay-crds`."""

VERL_VERSION = importlib.metadata.version("verl")
collect_ignore = [] if VERL_VERSION.startswith("0.9.") else ["verl09"]
"""tests/verl09 runs against verl 0.9.1, in the 0.9 line's environment (`make test-verl09`: .venv-verl09);
the rest of the suite runs against the default line's verl 0.6.1."""


def repo_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that must import this checkout's code first."""
    env = dict(os.environ)
    paths = [str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


@pytest.fixture
def python() -> str:
    return sys.executable



SAME_WORKER: dict[str, str] = {
    path: "operator-cluster"
    for path in (
        "tests/operator/test_integration.py",
        "tests/operator/test_integration_admission.py",
        "tests/operator/test_integration_cluster.py",
        "tests/operator/test_integration_isolation.py",
        "tests/operator/test_integration_stalls.py",
        "tests/operator/test_integration_tracking.py",
        "tests/operator/test_integration_upstream.py",
        "tests/operator/test_preflight_stage.py",
        "tests/operator/test_zz_rbac.py",
    )
}
"""Test files that must share one process: the operator's emulator modules record every request the
operator makes, and test_zz_rbac (last in the group) checks the grants against all of them."""
SAME_WORKER_DIRECTORIES = ("tests/sandbox/", "tests/e2e/")
"""Directories run by one worker, file after file: the sandbox suites start servers that fork-bomb,
fill memory and sweep scratch space, and are not run beside each other; the end-to-end suites share
one session-scoped control plane (etcd, kube-apiserver, controllers, KubeRay, Kueue) per worker, so
they run in one worker and start it once."""


def worker_group(path: str) -> str:
    """The unit of work of a test file under ``make test`` (pytest-xdist, ``--dist loadfile``)."""
    return SAME_WORKER.get(path) or next((d for d in SAME_WORKER_DIRECTORIES if path.startswith(d)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the groups of ``worker_group``: each test file runs whole on one worker
    (its module-scoped servers start once), and the files of one group run in one worker, in order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid.split("::", 1)[0])

    return GroupedFileScheduling(config, log)


XDIST_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) + int(os.environ.get("RETOOL_TEST_WORKER_OFFSET", "0"))
"""This pytest-xdist worker's index (0 without xdist), past ``RETOOL_TEST_WORKER_OFFSET``: `make test` runs the 0.9
line's session beside the main one, and its workers must not take the main workers' sandbox uids."""
SANDBOX_UID_FIRST = 40000
SANDBOX_UID_BAND = 64
"""Execution uids one test server may use (its slots: no test server has more workers)."""
SANDBOX_UID_BANDS = 3
"""Bands per xdist worker: the default servers, the ``server`` fixture's, the fallback tests'."""
MAPPED_IDS = 65536
"""The ids the ``k8s-userns`` test shape maps (0..65535), as a pod with ``hostUsers: false`` gets."""


def sandbox_uid_base(band: int = 0, worker: int | None = None) -> int:
    """Execution uids for a sandbox server this xdist worker starts. The kernel counts RLIMIT_NPROC
    per uid and the scratch sweep removes files by uid, so servers of two workers running at once
    must not share execution uids (in a cluster every replica has its own user namespace or pod);
    and every uid stays inside the ids a ``hostUsers: false`` pod maps, for up to 133 workers."""
    if not 0 <= band < SANDBOX_UID_BANDS:
        raise ValueError(f"uid band {band} is not one of 0..{SANDBOX_UID_BANDS - 1}")
    index = XDIST_WORKER if worker is None else worker
    base = SANDBOX_UID_FIRST + SANDBOX_UID_BAND * (SANDBOX_UID_BANDS * index + band)
    if base + SANDBOX_UID_BAND > MAPPED_IDS:
        raise ValueError(f"xdist worker {index} has no execution uids left below {MAPPED_IDS}")
    return base


os.environ.setdefault("RETOOL_SANDBOX_UID_BASE", str(sandbox_uid_base()))
# MLflow's telemetry thread sets and unsets _MLFLOW_TELEMETRY_SESSION_ID in os.environ while other
# threads iterate it (requests reads proxies from the environment on every call): a KeyError in a
# test's MLflow request. Tests send nothing beyond 127.0.0.1 anyway.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
