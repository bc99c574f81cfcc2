"""docs/install.md: the install, upgrade and uninstall commands work as written against the rendered chart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, helm, render
from tests.chart.values_doc import value_keys
from tests.conftest import REPO
from upstream.pins import kuberay_version

KUBERAY_VERSION = kuberay_version().removeprefix("v")
"""The documented KubeRay is the one the RayJobs are validated against (upstream/versions.env)."""

README = (REPO / "docs" / "install.md").read_text()


def section(title: str) -> str:
    start = README.index(f"\n### {title}\n")
    end = README.find("\n## ", start + 1)
    nxt = README.find("\n### ", start + 1)
    return README[start : min(x for x in (end, nxt) if x != -1)]


def commands(text: str) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    out = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                out.append(shlex.split(line))
    return out


def is_retool_install(cmd: list[str]) -> bool:
    """`helm install|upgrade retool <this chart or its package> ...` (not KubeRay's own chart)."""
    return cmd[:2] in (["helm", "install"], ["helm", "upgrade"]) and (cmd[3] == "charts/retool" or cmd[3].startswith("dist/retool-"))


def as_template(cmd: list[str], chart: Path, package: Path) -> list[str]:
    """`helm install|upgrade NAME CHART args` -> the `helm template` arguments rendering the same objects."""
    assert is_retool_install(cmd), cmd
    release, chart_path, *args = cmd[2:]
    if chart_path.startswith("dist/"):
        assert chart_path == f"dist/{package.name}", "the docs name the package `make chart` writes"
    else:
        assert (REPO / chart_path).resolve() == CHART
    out = []
    for i, arg in enumerate(args):
        if arg in ("--create-namespace", "--wait"):
            continue
        if i and args[i - 1] == "-f":
            arg = str(REPO / arg) if (REPO / arg).is_file() else str(CHART / "values.yaml")  # my-values.yaml: the user's own
        out.append(arg)
    return [release, *out]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.chart.helm import helm

    dist = tmp_path_factory.mktemp("dist")
    helm("package", CHART, "--destination", dist)
    (tgz,) = dist.glob("*.tgz")
    return tgz


@pytest.mark.parametrize("title", ["Install", "Upgrade"])
def test_helm_commands_render(chart: Path, package: Path, title: str) -> None:
    """Every install/upgrade of the retool chart (source tree or package) renders on a cluster with KubeRay."""
    helm_cmds = [c for c in commands(section(title)) if is_retool_install(c)]
    assert helm_cmds
    for cmd in helm_cmds:
        release, *args = as_template(cmd, chart, package)
        source = package if cmd[3].startswith("dist/") else chart
        docs = render(source, *args, release=release, namespace=args[args.index("--namespace") + 1])
        assert any(d["kind"] == "Deployment" for d in docs)


def test_kuberay_is_installed_with_its_own_chart_before_retool() -> None:
    cmds = [" ".join(c) for c in commands(section("Install"))]
    add = cmds.index("helm repo add kuberay https://ray-project.github.io/kuberay-helm/")
    kuberay = next(i for i, c in enumerate(cmds) if c.startswith(f"helm install kuberay-operator kuberay/kuberay-operator --version {KUBERAY_VERSION}"))
    retool = next(i for i, c in enumerate(cmds) if c.startswith("helm install retool charts/retool"))
    assert add < kuberay < retool
    assert not [c for c in cmds if "dependency" in c]


def test_commands_without_a_cluster_render(chart: Path) -> None:
    for cmd in commands(section("Install")):
        if cmd[:2] == ["helm", "template"]:
            assert cmd[3] == "charts/retool"
            out = helm("template", *cmd[2:3], chart, *cmd[4:]).stdout
            assert "kind: Deployment" in out


def test_upgrade_applies_the_crds_first() -> None:
    cmds = [c for c in commands(section("Upgrade"))]
    first = cmds[0]
    assert first[:3] == ["kubectl", "apply", "--server-side"] and first[-2:] == ["-f", "charts/retool/crds/"]
    assert (REPO / "charts/retool/crds").is_dir()
    assert "Helm installs the files in `crds/` on the first install only" in section("Upgrade")


def test_object_names_in_the_commands_exist(rendered) -> None:
    docs = rendered("default")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    text = section("Install") + section("Uninstall")
    assert ("Deployment", "retool-operator") in names and "deployment/retool-operator" in text
    assert ("Service", "retool-mlflow") in names and "svc/retool-mlflow" in text
    assert ("PersistentVolumeClaim", "retool-mlflow") in names and "delete pvc retool-mlflow" in text
    crd = yaml.safe_load((CHART / "crds" / "retoolruns.retool.dev.yaml").read_text())
    assert f"kubectl delete crd {crd['metadata']['name']}" in text


def documented_keys(text: str) -> list[str]:
    """Dotted paths of the values documented with `# --` in values.yaml."""
    return [key.path for key in value_keys(text) if key.documented]


def test_values_reference_lists_every_value() -> None:
    keys = documented_keys((CHART / "values.yaml").read_text())
    assert len(keys) > 50
    reference = section("Configure")
    assert [k for k in keys if f"| `{k}` |" not in reference] == []
