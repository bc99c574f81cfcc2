"""Run the real helm binary against the chart and parse what it renders.

KubeRay is a prerequisite the chart checks for (``.Capabilities.APIVersions.Has "ray.io/v1/RayJob"``);
``helm template`` has no cluster, so ``render`` passes ``--api-versions ray.io/v1/RayJob`` as a
cluster with KubeRay would report it (``KUBERAY``), unless told otherwise.
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


KUBERAY = ("--api-versions", "ray.io/v1/RayJob")
"""What a cluster with KubeRay installed adds to the capabilities ``helm install`` sees."""


def chart_copy(dest: Path) -> Path:
    """The chart as a fresh checkout has it: a copy without anything a developer built next to it."""
    target = dest / "retool"
    shutil.copytree(CHART, target, ignore=lambda d, names: {"charts", "Chart.lock"} & set(names) if Path(d) == CHART else set())
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


def render(chart: Path, *args: str, namespace: str = NAMESPACE, release: str = RELEASE, kuberay: bool = True) -> list[dict[str, Any]]:
    """``helm template`` (tests included) -> the list of rendered objects, on a cluster with KubeRay unless ``kuberay=False``."""
    out = helm("template", release, chart, "--namespace", namespace, *(KUBERAY if kuberay else ()), *args).stdout
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
