"""The README's install, upgrade and uninstall commands work as written against the rendered chart."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, render
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


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


def as_template(cmd: list[str], chart: Path) -> list[str]:
    """`helm install|upgrade NAME CHART args` -> the `helm template` arguments rendering the same objects."""
    assert cmd[:2] in (["helm", "install"], ["helm", "upgrade"]), cmd
    release, chart_path, *args = cmd[2:]
    assert (REPO / chart_path).resolve() == CHART
    out = []
    for i, arg in enumerate(args):
        if arg in ("--create-namespace", "--wait"):
            continue
        if i and args[i - 1] == "-f":
            arg = str(REPO / arg) if (REPO / arg).is_file() else str(CHART / "values.yaml")  # my-values.yaml: the user's own
        out.append(arg)
    return [release, *out]


@pytest.mark.parametrize("title", ["Install", "Upgrade"])
def test_helm_commands_render(chart: Path, title: str) -> None:
    helm_cmds = [c for c in commands(section(title)) if c[:2] in (["helm", "install"], ["helm", "upgrade"])]
    assert helm_cmds
    for cmd in helm_cmds:
        release, *args = as_template(cmd, chart)
        docs = render(chart, *args, release=release, namespace=args[args.index("--namespace") + 1])
        assert any(d["kind"] == "Deployment" for d in docs)


def test_dependencies_are_built_before_installing() -> None:
    cmds = [" ".join(c) for c in commands(section("Install"))]
    (dep,) = yaml.safe_load((CHART / "Chart.yaml").read_text())["dependencies"]
    add = cmds.index(f"helm repo add kuberay {dep['repository']}")
    assert add < cmds.index("helm dependency build charts/retool") < next(i for i, c in enumerate(cmds) if c.startswith("helm install"))


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
    lines = text.splitlines()
    stack: list[tuple[int, str]] = []
    value_indent: int | None = None
    keys = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):(\s|$)", line)
        if not m:
            continue
        indent = len(m.group(1))
        if value_indent is not None and indent > value_indent:
            continue
        value_indent = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        if j >= 0 and lines[j].strip().startswith("# --") and all(lines[k].strip().startswith("#") for k in range(j, i)):
            keys.append(".".join([k for _, k in stack] + [m.group(2)]))
            value_indent = indent
        else:
            stack.append((indent, m.group(2)))
    return keys


def test_values_reference_lists_every_value() -> None:
    keys = documented_keys((CHART / "values.yaml").read_text())
    assert len(keys) > 50
    reference = section("Configure")
    assert [k for k in keys if f"| `{k}` |" not in reference] == []
