"""Chart.yaml, lint and NOTES: what an administrator sees before and right after installing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, HelmError, helm
from tests.chart.profiles import PROFILES, render_profile
from tests.conftest import REPO

META = yaml.safe_load((CHART / "Chart.yaml").read_text())
PYPROJECT = (REPO / "pyproject.toml").read_text()


def test_kuberay_operator_is_an_optional_pinned_dependency_off_by_default() -> None:
    (dep,) = [d for d in META["dependencies"] if d["name"] == "kuberay-operator"]
    assert re.fullmatch(r"1\.\d+\.\d+", dep["version"]), "pin an exact 1.x version"
    assert dep["repository"] == "https://ray-project.github.io/kuberay-helm/"
    assert dep["condition"] == "kuberay-operator.enabled"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["kuberay-operator"] == {"enabled": False}


def test_helm_reads_the_dependency_entry() -> None:
    rows = [line.split() for line in helm("dependency", "list", CHART).stdout.splitlines()[1:] if line.strip()]
    assert [r[:3] for r in rows] == [["kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/"]]


def test_helm_needs_the_dependency_built_even_when_disabled(tmp_path: Path) -> None:
    """Why the README says `helm dependency build` first: Helm 4 checks declared dependencies unconditionally."""
    checkout = shutil.copytree(CHART, tmp_path / "retool", ignore=lambda d, names: {"charts"} & set(names) if Path(d) == CHART else set())
    with pytest.raises(HelmError, match="missing in charts/ directory: kuberay-operator"):
        helm("template", "retool", checkout)


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
    missing: list[str] = []
    value_indent: int | None = None  # inside a documented value's nested default
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):(\s|$)", line)
        if not m:
            continue
        indent = len(m.group(1))
        if value_indent is not None and indent > value_indent:
            continue
        value_indent = None
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --") and all(lines[k].strip().startswith("#") for k in range(j, i))
        if documented:
            value_indent = indent
        elif not _has_children(lines, i, indent):
            missing.append(f"line {i + 1}: {line.strip()}")
    return missing


def _has_children(lines: list[str], i: int, indent: int) -> bool:
    for nxt in lines[i + 1 :]:
        if not nxt.strip() or nxt.strip().startswith("#"):
            continue
        return len(nxt) - len(nxt.lstrip()) > indent
    return False


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
        pytest.param([], ["kubectl apply -n <namespace> -f my-run.yaml", "port-forward svc/retool-mlflow 5000:5000", "Admission webhook: off"], id="default install"),
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
    out = helm("install", "retool", chart, "--namespace", "retool-system", "--dry-run=client", *flags).stdout
    notes = out[out.index("NOTES:") :]
    for text in expected:
        assert text in notes
