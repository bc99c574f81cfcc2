"""Chart.yaml, lint and NOTES: what an administrator sees before and right after installing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, HelmError, helm, render
from tests.chart.profiles import PROFILES, render_profile
from tests.chart.values_doc import value_keys
from tests.conftest import REPO

META = yaml.safe_load((CHART / "Chart.yaml").read_text())
PYPROJECT = (REPO / "pyproject.toml").read_text()


def test_kuberay_is_a_prerequisite_the_chart_checks_not_a_dependency() -> None:
    assert "dependencies" not in META, "a declared dependency must be downloaded before Helm renders the chart at all"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["kuberay"] == {"checkInstalled": True}
    assert "charts/" in (CHART / ".helmignore").read_text()  # a leftover of an old `helm dependency build` is never rendered


def test_install_without_kuberay_fails_naming_the_fix(chart: Path) -> None:
    with pytest.raises(HelmError) as err:
        render(chart, kuberay=False)
    message = str(err.value)
    assert "KubeRay is not installed: this cluster serves no ray.io/v1 RayJob API" in message
    assert "helm install kuberay-operator kuberay/kuberay-operator --version 1.6.1" in message
    assert "--set kuberay.checkInstalled=false" in message


def test_the_check_can_be_skipped_where_there_is_no_cluster(chart: Path) -> None:
    with_api = render(chart)
    skipped = render(chart, "--set", "kuberay.checkInstalled=false", kuberay=False)
    assert [d["kind"] for d in skipped] == [d["kind"] for d in with_api]


def test_a_fresh_checkout_renders_with_no_extra_step(tmp_path: Path) -> None:
    """Exactly the files git tracks, nothing fetched: what `git clone` gives (no `helm dependency build`)."""
    tracked = subprocess.run(["git", "ls-files", "charts/retool"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert "charts/retool/Chart.yaml" in tracked
    for name in tracked:
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, target)
    docs = render(tmp_path / "charts" / "retool")
    assert {"Deployment", "ConfigMap", "ClusterRole"} <= {d["kind"] for d in docs}
    proc = helm("lint", "--strict", tmp_path / "charts" / "retool", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_versions_match_the_python_package() -> None:
    assert META["appVersion"] == re.search(r'^version = "([^"]+)"', PYPROJECT, re.M).group(1)
    assert META["kubeVersion"] == ">=1.29.0-0"
    mlflow_pin = re.search(r'"(mlflow==[^"]+)"', PYPROJECT).group(1)
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["mlflow"]["image"]["tag"]
    assert tag == f"v{mlflow_pin.removeprefix('mlflow==')}-full", "the tracker and the trainers' MLflow client must be the same version"


def test_crds_directory_holds_exactly_the_generated_retoolrun_crd() -> None:
    files = sorted(p.name for p in (CHART / "crds").iterdir())
    assert files == ["retoolruns.retool.dev.yaml"]
    assert (CHART / "crds" / files[0]).read_text().startswith("# Generated from retool/spec/model.py")


def test_every_value_is_documented() -> None:
    """helm-docs convention: a `# --` comment above every value. A key whose comment is `# --`
    holds a value (its nested lines are that value's default); a key without one is a section
    whose own keys must be documented."""
    assert undocumented_values((CHART / "values.yaml").read_text()) == []


def undocumented_values(text: str) -> list[str]:
    lines = text.splitlines()
    return [f"line {key.line + 1}: {lines[key.line].strip()}" for key in value_keys(text) if not key.documented and not key.has_children]


def test_the_documentation_check_finds_an_undocumented_value() -> None:
    assert undocumented_values("a:\n  # -- doc\n  b: 1\n  c: 2\n") == ["line 4: c: 2"]


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_strict(chart: Path, ca_bundle: str, profile: str) -> None:
    args = PROFILES[profile].args()
    if profile == "webhook-secret":
        args += ["--set", f"webhook.certificates.caBundle={ca_bundle}"]
    args = [a for a in args if a not in ("--api-versions", "cert-manager.io/v1")]
    proc = helm("lint", "--strict", chart, *args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    render_profile(chart, profile, ca_bundle)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param(
            [],
            ["kubectl apply -n <namespace> -f my-run.yaml", "port-forward svc/retool-mlflow 5000:5000", "Admission webhook: off", "KubeRay: not checked"],
            id="default install",
        ),
        pytest.param(
            ["--set", "defaults.batchScheduler=volcano"], ["KubeRay must run with\n--batch-scheduler=volcano", "batchScheduler.name=volcano"], id="gang scheduling with volcano"
        ),
        pytest.param(["--set", "webhook.certificates.source=certManager"], ["Admission webhook: on, certificate from cert-manager"], id="with cert-manager"),
        pytest.param(
            ["--set", "mlflow.enabled=false", "--set", "mlflow.externalTrackingUri=https://mlflow.example.com"],
            ["runs log to https://mlflow.example.com"],
            id="external MLflow",
        ),
        pytest.param(
            ["--set", "mlflow.ingress.enabled=true", "--set", "mlflow.ingress.hosts[0]=mlflow.example.com"],
            ["UI: http://mlflow.example.com/"],
            id="MLflow behind an Ingress",
        ),
        pytest.param(["--set", "watchNamespaces={team-a,team-b}"], ["watching namespaces team-a, team-b"], id="namespaced"),
    ],
)
def test_notes_tell_how_to_submit_a_run_and_open_mlflow(chart: Path, flags: list[str], expected: list[str]) -> None:
    # `helm install --dry-run=client` sees no cluster, hence no KubeRay: the check is skipped.
    out = helm("install", "retool", chart, "--namespace", "retool-system", "--dry-run=client", "--set", "kuberay.checkInstalled=false", *flags).stdout
    notes = out[out.index("NOTES:") :]
    for text in expected:
        assert text in notes
