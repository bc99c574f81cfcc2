"""The package builds without a warning of its own (issue 50, item 1: a first `make demo` showed only the
project's setuptools warnings, which read like trouble).

The real build backend (setuptools, as pip drives it) builds a wheel of a copy of the tree; the test reads
what it prints. ``--no-build-isolation``: the dev environment's setuptools, no download.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO

PACKAGE_FILES = ("pyproject.toml", "setup.py", "README.md")
PACKAGE_DIRS = ("retool", "retool_operator")


def package_tree(tmp_path: Path) -> Path:
    """What a build of the package reads, copied from the checkout (no built or cached files)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in PACKAGE_FILES:
        shutil.copy2(REPO / name, tree / name)
    for name in PACKAGE_DIRS:
        shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    return tree


def test_the_wheel_builds_without_a_warning_and_holds_the_compiled_setup(tmp_path: Path) -> None:
    tree = package_tree(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--verbose", "-w", str(tmp_path / "dist"), str(tree)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    warned = [line for line in output.splitlines() if "Warning" in line and ("setuptools" in line or "pyproject" in line or "BuildBackend" in line)]
    assert not warned, "\n".join(warned)
    wheels = list((tmp_path / "dist").glob("retool-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert any(name.startswith("retool/sandbox/_settle.") and name.endswith(".so") for name in names), "the compiled execution setup is in the wheel"


def test_the_editable_install_prints_no_warning_of_the_project(tmp_path: Path) -> None:
    """``make install`` installs the checkout editable; setuptools' meta-path-finder strategy (chosen for any
    layout but one root) prints "InformationOnly: Editable installation ... be careful with folders" at every
    install (issue 50). The editable wheel is built as pip builds it, through the backend's own hook."""
    tree = package_tree(tmp_path)
    (tmp_path / "dist").mkdir()
    build = f"from setuptools import build_meta; print(build_meta.build_editable({str(tmp_path / 'dist')!r}))"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", build], cwd=tree, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    warned = [line for line in output.splitlines() if "Warning" in line or "InformationOnly" in line or "be careful" in line]
    assert not warned, "\n".join(warned)
    wheel = zipfile.ZipFile(next((tmp_path / "dist").glob("retool-*.editable-*.whl")))
    pth = [name for name in wheel.namelist() if name.endswith(".pth")]
    assert len(pth) == 1 and wheel.read(pth[0]).decode().strip() == str(tree), "the editable install is the root on sys.path, no finder"
