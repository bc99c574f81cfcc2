"""`make chart` packages the chart, and the package installs the same objects as the source tree."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, HELM, HelmError, helm, render
from tests.chart.profiles import PROFILES, render_profile
from tests.conftest import REPO

META = yaml.safe_load((CHART / "Chart.yaml").read_text())


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make chart` into a temporary directory, with this checkout's helm."""
    dist = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "MAKEFLAGS": ""}
    proc = subprocess.run(["make", "-s", "chart", f"DIST={dist}", f"HELM={HELM}"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tgz,) = dist.glob("*.tgz")
    assert tgz.name == f"retool-{META['version']}.tgz"
    return tgz


def test_the_package_holds_the_chart_and_its_crd_but_not_the_test_profiles(package: Path) -> None:
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert {"retool/Chart.yaml", "retool/values.yaml", "retool/values.schema.json", "retool/crds/retoolruns.retool.dev.yaml"} <= names
    assert not [n for n in names if n.startswith(("retool/ci/", "retool/charts/"))]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_package_renders_the_same_objects_as_the_source_tree(package: Path, chart: Path, ca_bundle: str, profile: str) -> None:
    source = render_profile(chart, profile, ca_bundle)
    packaged = render_profile(package, profile, ca_bundle)
    key = lambda d: (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", ""))  # noqa: E731
    assert sorted(packaged, key=key) == sorted(source, key=key)


def test_the_package_installs_and_checks_for_kuberay(package: Path) -> None:
    out = helm("install", "retool", package, "--namespace", "retool-system", "--create-namespace", "--dry-run=client", "--set", "kuberay.checkInstalled=false").stdout
    assert "kind: Deployment" in out and "NOTES:" in out
    with pytest.raises(HelmError, match="KubeRay is not installed"):
        helm("install", "retool", package, "--namespace", "retool-system", "--dry-run=client")
    docs = render(package)
    assert {d["kind"] for d in docs} >= {"Deployment", "ConfigMap", "Service"}
