"""The operator and sandbox images run on exactly what `pip install ".[<extra>]"` gives them
(images/operator/Dockerfile, images/sandbox/Dockerfile).

The test environment holds every extra, so a module importing something only the dev or train
extras bring (pandas through full mlflow, the sync kubernetes client, ...) would pass every other
test and crash the pod at start. Here each image's distribution set is resolved from pyproject.toml
the way the image's pip does (uv, Python 3.11, linux x86_64), and every module of the package the
image runs is imported with every other installed distribution hidden, its metadata included.
"""

from __future__ import annotations

import functools
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
    DROP_TESTS = sys.argv[5] == "drop-tests"
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
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec is not None and DROP_TESTS and "/site-packages/" in (spec.origin or "") and "tests" in spec.origin.split("/site-packages/")[1].split("/"):
                HIDDEN.append(name)  # the sandbox Dockerfile deletes the libraries' tests directories
                return None
            return spec
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
    package, later = sys.argv[2], [m for m in sys.argv[3].split(",") if m]
    try:
        root = importlib.import_module(package)
        found = [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]
        names = [package] + [n for n in found if not n.endswith(".__main__")] + later  # __main__ runs the program
        for name in names:
            importlib.import_module(name)
        exec(sys.argv[4])
    except ImportError as err:
        sys.exit(f"{err!r}; hidden (not in the image): {sorted(set(HIDDEN))}")
    print("imported", len(names), "modules; hidden:", sorted(set(HIDDEN)))
    """
)


OPERATOR_THEN = """
from mlflow import MlflowClient
from mlflow.version import IS_MLFLOW_SKINNY
assert IS_MLFLOW_SKINNY, "the image installs mlflow-skinny only"
MlflowClient(tracking_uri="http://127.0.0.1:9")._tracking_client.store  # the REST store the operator talks through (no request)
"""

SANDBOX_THEN = """
from retool.sandbox.settings import DEFAULT_PRELOAD
from retool.sandbox.template import load
problems = load(list(DEFAULT_PRELOAD))  # what a warm interpreter imports, and its warm-up calls
assert not problems, problems
"""

IMAGES = {
    # image: (extra, the package it runs, what it imports later, a check after the imports, whether
    # its Dockerfile deletes the libraries' tests directories)
    # The operator: retool_operator/tracking.py imports retool.tracking when it creates parent runs,
    # and retool/tracking/_client.py the MLflow client then.
    "operator": ("operator", "retool_operator", ["retool.tracking", "mlflow", "mlflow.exceptions"], OPERATOR_THEN, False),
    # The sandbox: CMD `retool sandbox serve` (retool.cli), and the libraries its warm interpreters preload.
    "sandbox": ("sandbox", "retool.sandbox", ["retool.cli", "retool.cli.sandbox"], SANDBOX_THEN, True),
}


@functools.cache
def image_distributions(extra: str) -> frozenset[str]:
    """The distributions pip installs for an image: the project's dependencies and the image's extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"][extra]]
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp, f"{extra}.in")
        inputs.write_text("\n".join(requirements) + "\n")
        result = subprocess.run(
            [lock.uv_binary(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--no-annotate", "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
             "--cache-dir", lock.uv_cache_dir(), str(inputs)],
            capture_output=True, text=True, env=lock.uv_environment(), timeout=600, check=False,
        )  # fmt: skip
    assert result.returncode == 0, f"resolving the {extra} extra failed:\n{result.stderr[-3000:]}"
    return frozenset({"retool"} | {lock.canonical(line.split("==", 1)[0]) for line in result.stdout.splitlines() if "==" in line})


def import_with_only(image: str, distributions: frozenset[str]) -> subprocess.CompletedProcess:
    _, package, later, then, drop_tests = IMAGES[image]
    argv = [sys.executable, "-c", BLOCKER, ",".join(sorted(distributions)), package, ",".join(later), then, "drop-tests" if drop_tests else "keep"]
    return subprocess.run(argv, capture_output=True, text=True, env=repo_env(), cwd=REPO, timeout=300, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_module_imports_with_only_the_images_extra_installed(image: str) -> None:
    allowed = image_distributions(IMAGES[image][0])
    assert not {"kubernetes", "pandas", "torch"} & allowed, "the operator and sandbox images stay small"
    imported = import_with_only(image, allowed)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.startswith("imported"), imported.stdout


def test_the_check_refuses_what_the_image_lacks() -> None:
    """The check itself: the operator's set without kubernetes-asyncio fails, naming it."""
    imported = import_with_only("operator", image_distributions("operator") - {"kubernetes-asyncio"})
    assert imported.returncode != 0
    assert "kubernetes_asyncio" in imported.stderr and "not in the image" in imported.stderr
