"""Run the real helm binary against the chart and parse what it renders.

Helm 4 refuses to render a chart whose Chart.yaml declares a dependency that is missing from
charts/, even when the dependency's condition is false, and fetching the KubeRay chart needs
a network this test suite does not have. So the tests render an offline copy of the chart whose
Chart.yaml differs only by that one dependency entry (test_chart_metadata.py checks the entry
itself); everything else, values.yaml and the schema included, is the checked-in file.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

CHART = REPO / "charts" / "retool"
PROFILES_DIR = CHART / "ci"
HELM = REPO / ".tools" / "helm"
RELEASE = "retool"
NAMESPACE = "retool-system"


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def offline_chart(dest: Path) -> Path:
    """Copy the chart to ``dest/retool`` without the (undownloadable) KubeRay dependency entry."""
    target = dest / "retool"
    # Leave out what `helm dependency build` may have fetched into this checkout: Helm would
    # render an undeclared chart found in charts/ unconditionally.
    shutil.copytree(CHART, target, ignore=lambda d, names: {"charts", "Chart.lock"} & set(names) if Path(d) == CHART else set())
    meta = yaml.safe_load((target / "Chart.yaml").read_text())
    meta["dependencies"] = [d for d in meta.get("dependencies", []) if d["name"] != "kuberay-operator"]
    if not meta["dependencies"]:
        del meta["dependencies"]
    (target / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return target


def helm(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(HELM), *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc


@dataclass(frozen=True)
class Profile:
    """A documented way to install the chart: values files plus extra helm flags."""

    name: str
    values: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()

    def args(self) -> list[str]:
        out: list[str] = []
        for v in self.values:
            out += ["-f", str(PROFILES_DIR / v)]
        return out + list(self.flags)


def render(chart: Path, *args: str, namespace: str = NAMESPACE, release: str = RELEASE) -> list[dict[str, Any]]:
    """``helm template`` (tests included) -> the list of rendered objects."""
    out = helm("template", release, chart, "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def objects_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def operator_config(docs: list[dict[str, Any]]) -> dict[str, str]:
    return one(docs, "ConfigMap", "-operator-config")["data"]


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)
