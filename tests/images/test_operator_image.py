"""The operator image runs on exactly what `pip install ".[operator]"` gives it (images/operator/Dockerfile).

The test environment holds every extra, so an operator module importing something only the dev or
train extras bring (pandas through full mlflow, the sync kubernetes client, ...) would pass every
other test and crash the operator pod at start. Here the operator's distribution set is resolved
from pyproject.toml the way the image's pip does (uv, Python 3.11, linux x86_64), and every module
of ``retool_operator`` is imported with any other installed distribution blocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO, repo_env
from tests.images.test_locks import lock

BLOCKER = textwrap.dedent(
    """
    import importlib, importlib.machinery, importlib.metadata, pkgutil, re, sys
    ALLOWED = set(sys.argv[1].split(","))
    OWNERS = importlib.metadata.packages_distributions()
    HIDDEN = []
    def canonical(name):
        return re.sub(r"[-_.]+", "-", name).lower()
    class ImageOnly:
        # Stands in for PathFinder: a distribution outside the image is simply not there, so
        # optional imports (``find_spec(...) is None``) take their fallback as they would in the image.
        @staticmethod
        def find_spec(name, path=None, target=None):
            owners = {canonical(d) for d in OWNERS.get(name.split(".")[0], ())}
            if owners and not owners & ALLOWED:
                HIDDEN.append(name)
                return None
            return importlib.machinery.PathFinder.find_spec(name, path, target)
        @staticmethod
        def find_distributions(*args, **kwargs):
            # importlib.metadata asks the same finders: the image has no metadata of what it lacks
            # (mlflow decides skinny vs full, and whether it has a client at all, from it).
            found = importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
            return (d for d in found if canonical(d.metadata["Name"]) in ALLOWED)
        @staticmethod
        def invalidate_caches():
            importlib.machinery.PathFinder.invalidate_caches()
    sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = ImageOnly
    try:
        import retool_operator
        names = [m.name for m in pkgutil.walk_packages(retool_operator.__path__, "retool_operator.")]
        # What the operator loads later: retool_operator/tracking.py imports retool.tracking when it
        # creates parent runs, and retool/tracking/_client.py imports the MLflow client then.
        names += ["retool.tracking", "mlflow", "mlflow.exceptions"]
        for name in names:
            importlib.import_module(name)
        from mlflow import MlflowClient
        from mlflow.version import IS_MLFLOW_SKINNY
        assert IS_MLFLOW_SKINNY, "the image installs mlflow-skinny only"
        MlflowClient(tracking_uri="http://127.0.0.1:9")._tracking_client.store  # the REST store the operator talks through (no request)
    except ImportError as err:
        sys.exit(f"{err!r}; hidden (not in the operator image): {sorted(set(HIDDEN))}")
    print("imported", len(names), "modules; hidden:", sorted(set(HIDDEN)))
    """
)


def operator_distributions() -> set[str]:
    """The distributions pip installs for the image: the project's dependencies and its operator extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["operator"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp, "operator.in")
        inputs.write_text("\n".join(requirements) + "\n")
        result = subprocess.run(
            [lock.uv_binary(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--no-annotate", "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
             "--cache-dir", str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "retool-uv")), str(inputs)],
            capture_output=True, text=True, env=env, timeout=600, check=False,
        )  # fmt: skip
    assert result.returncode == 0, f"resolving the operator extra failed:\n{result.stderr[-3000:]}"
    return {"retool"} | {lock.canonical(line.split("==", 1)[0]) for line in result.stdout.splitlines() if "==" in line}


def import_with_only(distributions: set[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER, ",".join(sorted(distributions))], capture_output=True, text=True, env=repo_env(), cwd=REPO, timeout=300, check=False)


@pytest.mark.slow
def test_every_operator_module_imports_with_only_the_operator_extra_installed() -> None:
    allowed = operator_distributions()
    assert {"kopf", "kubernetes-asyncio", "aiohttp", "mlflow-skinny"} <= allowed
    assert not {"kubernetes", "pandas", "torch"} & allowed, "the operator image must stay small"
    imported = import_with_only(allowed)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.startswith("imported"), imported.stdout


def test_the_blocker_refuses_what_the_image_lacks() -> None:
    """The check itself: the image's set without kubernetes-asyncio fails, naming it."""
    imported = import_with_only(operator_distributions() - {"kubernetes-asyncio"})
    assert imported.returncode != 0
    assert "kubernetes_asyncio" in imported.stderr and "not in the operator image" in imported.stderr
