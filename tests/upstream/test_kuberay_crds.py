"""The fetch step of the KubeRay CRDs (upstream/kuberay_crds.py) and the pins it reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import KUBERAY_SCHEMAS, REPO, repo_env
from upstream import kuberay_crds
from upstream.pins import KUBERAY_MODULE, kuberay_version, pins


def test_every_pin_is_a_go_module_version() -> None:
    assert set(pins()) >= {"KUBERAY_VERSION", "KUEUE_VERSION", "KWOK_VERSION", "KUBERNETES_VERSION", "ETCD_VERSION"}
    assert all(v.startswith("v") and v[1].isdigit() for v in pins().values()), pins()


def test_the_fetched_crds_name_their_module_and_checksum() -> None:
    """What `make kuberay-crds` left for the suite is the pinned module, checked by its go.sum hash."""
    module, _, checksum = (KUBERAY_SCHEMAS / "SOURCE").read_text().splitlines()[0].partition(" ")
    assert module == f"{KUBERAY_MODULE}@{kuberay_version()}"
    assert checksum.startswith("h1:")
    assert {"ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"} <= {p.name for p in KUBERAY_SCHEMAS.glob("*.yaml")}


def test_fetch_copies_the_crds_from_the_module_cache(tmp_path: Path) -> None:
    files = kuberay_crds.fetch(tmp_path / "crds")
    assert {f.name for f in files} >= set(kuberay_crds.REQUIRED)
    assert [f.read_bytes() for f in sorted(files)] == [(KUBERAY_SCHEMAS / f.name).read_bytes() for f in sorted(files)]
    assert not (tmp_path / "crds.partial").exists()


def test_a_version_the_module_proxy_refuses_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "upstream.kuberay_crds", str(tmp_path / "crds"), "--version", "v0.0.0-no-such-version"],
        env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"kuberay-crds: go mod download {KUBERAY_MODULE}@v0.0.0-no-such-version") and "Traceback" not in result.stderr
    assert not (tmp_path / "crds").exists()


def test_without_go_the_error_says_what_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(kuberay_crds.FetchError, match="`go` is not on PATH"):
        kuberay_crds.fetch(tmp_path / "crds")
