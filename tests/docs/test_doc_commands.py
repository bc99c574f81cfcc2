"""Every command in the user-facing docs is run, or, where it needs a live cluster, checked against
what it names: README.md, docs/retoolrun.md, docs/install.md and docs/gitops.md.

Run for real: `retool ...` (this checkout's CLI), `helm template`, `helm install|upgrade` of this
chart (as the `helm template` that renders the same objects, on a cluster with KubeRay),
`kubectl kustomize`, pipelines of those, and `make` (`make -n`, a dry run, except `make chart`).
Checked offline: KubeRay's chart (the repository and the version our RayJobs are validated
against, its flags), `kubectl apply` (the files exist and are valid), `kubectl patch` (the patched
example is still valid), `kubectl get/describe/delete/rollout` (the objects and fields exist).
A command of any other kind fails the test: a new one needs a check here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.spec.validate import parse_run
from tests.chart.helm import CHART, HELM, KUBERAY, render
from tests.conftest import EXAMPLES, REPO, repo_env
from upstream.pins import kuberay_version

DOCS = ["README.md", "docs/retoolrun.md", "docs/install.md", "docs/gitops.md"]
KUBECTL = REPO / ".tools" / "kubectl"
KUBERAY_REPO = "https://ray-project.github.io/kuberay-helm/"
KUBERAY_VERSION = kuberay_version().removeprefix("v")
KUBERAY_VALUES = {"batchScheduler.name": {"volcano", "yunikorn"}}
"""The KubeRay chart values the docs set (kuberay-operator chart values.yaml: batchScheduler.name)."""
RELEASE, NAMESPACE = "retool", "retool-system"


@dataclass(frozen=True)
class Command:
    doc: str
    line: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.line}"


def doc_commands() -> list[Command]:
    out = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", (REPO / doc).read_text(), re.S):
            for line in block.splitlines():
                line = line.split("  #", 1)[0].strip()
                if line:
                    out.append(Command(doc, line))
    return out


COMMANDS = doc_commands()


def bash(line: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``line`` in bash with `retool` and `kubectl` meaning this checkout's CLI and the pinned kubectl."""
    prelude = f'retool() {{ "{sys.executable}" -m retool.cli "$@"; }}\nkubectl() {{ "{KUBECTL}" "$@"; }}\n'
    return subprocess.run(["bash", "-euo", "pipefail", "-c", prelude + line], cwd=REPO, env=repo_env(**env), capture_output=True, text=True, timeout=300)


def examples_by_name() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in (yaml.safe_load(p.read_text()) for p in EXAMPLES)}


@pytest.fixture(scope="module")
def chart_objects() -> list[dict[str, Any]]:
    return render(CHART)


def check_retool(cmd: Command, argv: list[str]) -> None:
    proc = bash(cmd.line)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip() or "all valid" in proc.stderr


def check_make(cmd: Command, argv: list[str], tmp_path: Path) -> None:
    target = argv[1]
    assert re.search(rf"^{re.escape(target)}:", (REPO / "Makefile").read_text(), re.M), f"{cmd}: no make target {target}"
    extra = [f"HELM={HELM}"]
    if target == "chart":
        proc = subprocess.run(["make", "-s", *argv[1:], f"DIST={tmp_path}", *extra], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "MAKEFLAGS": ""})
        assert proc.returncode == 0, proc.stderr
        assert list(tmp_path.glob("retool-*.tgz")), proc.stdout
        return
    proc = subprocess.run(["make", "-n", *argv[1:], *extra], cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "MAKEFLAGS": ""})
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}"


def helm_flags(subcommand: str) -> set[str]:
    out = subprocess.run([str(HELM), subcommand, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(--[a-z][a-z-]+)", out))


def check_helm(cmd: Command, argv: list[str], tmp_path: Path) -> None:
    sub = argv[1]
    if sub == "repo":
        assert argv[2:] == ["add", "kuberay", KUBERAY_REPO], cmd
        return
    flags = [a.split("=")[0] for a in argv if a.startswith("--")]
    assert set(flags) <= helm_flags(sub), f"{cmd}: unknown helm {sub} flags {set(flags) - helm_flags(sub)}"
    if sub in ("test", "uninstall"):
        assert argv[2] == RELEASE and argv[argv.index("--namespace") + 1] == NAMESPACE, cmd
        return
    release, chart, *rest = argv[2:]
    if chart == "kuberay/kuberay-operator":
        assert release == "kuberay-operator" and rest[rest.index("--version") + 1] == KUBERAY_VERSION, f"{cmd}: the RayJobs are validated against KubeRay {KUBERAY_VERSION}"
        for i, arg in enumerate(rest):
            if arg == "--set":
                key, _, value = rest[i + 1].partition("=")
                assert value in KUBERAY_VALUES.get(key, set()), f"{cmd}: KubeRay chart value {key}={value}"
        return
    if chart.startswith("dist/"):
        subprocess.run([str(HELM), "package", str(CHART), "--destination", str(tmp_path)], check=True, capture_output=True)
        source = tmp_path / Path(chart).name
        assert source.is_file(), f"{cmd}: `make chart` writes {list(tmp_path.glob('*.tgz'))}"
    else:
        assert (REPO / chart).resolve() == CHART, cmd
        source = CHART
    args = []
    for i, arg in enumerate(rest):
        if arg in ("--create-namespace", "--wait"):
            continue
        if i and rest[i - 1] == "-f" and not (REPO / arg).is_file():
            arg = str(CHART / "values.yaml")  # my-values.yaml: the reader's own
        elif i and rest[i - 1] == "-f":
            arg = str(REPO / arg)
        args.append(arg)
    cluster = () if sub == "template" else KUBERAY  # install/upgrade: on a cluster with KubeRay
    proc = subprocess.run([str(HELM), "template", release, str(source), *cluster, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
    assert "kind: Deployment" in proc.stdout


def _names_in(argv: list[str]) -> tuple[str | None, list[str]]:
    namespace = None
    rest = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("-n", "--namespace"):
            namespace, skip = argv[i + 1], True
            continue
        rest.append(arg)
    return namespace, rest


def check_kubectl(cmd: Command, argv: list[str], chart_objects: list[dict[str, Any]]) -> None:
    namespace, argv = _names_in(argv[1:])
    verb = argv[0]
    examples = examples_by_name()
    if verb == "kustomize":
        proc = bash(cmd.line)
        assert proc.returncode == 0, proc.stderr
        return
    if verb == "apply":
        path = REPO / argv[argv.index("-f") + 1]
        assert path.exists(), cmd
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if doc and doc.get("kind") == "RetoolRun":
                    parse_run(doc)
                else:
                    assert doc and doc.get("apiVersion") and doc.get("kind"), f"{cmd}: {file}"
        return
    if verb in ("get", "describe"):
        assert argv[1] in ("rr", "retoolruns"), cmd
        if len(argv) > 2 and not argv[2].startswith("-"):
            assert argv[2] in examples, f"{cmd}: no example named {argv[2]}"
        if "-o" in argv and argv[argv.index("-o") + 1].startswith("jsonpath="):
            field = re.fullmatch(r"jsonpath=\{\.status\.(\w+)\}", argv[argv.index("-o") + 1])
            assert field is not None, cmd
            crd = yaml.safe_load((CHART / "crds" / "retoolruns.retool.dev.yaml").read_text())
            assert field.group(1) in crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"], cmd
        return
    if verb == "patch" and argv[1] == "rr":
        doc = examples[argv[2]]
        assert (doc["metadata"].get("namespace") or "default") == (namespace or "default"), cmd
        assert argv[argv.index("--type") + 1] == "merge", cmd
        patch = json.loads(argv[argv.index("-p") + 1])
        patched = {**doc, "spec": {**doc["spec"], **patch.get("spec", {})}}
        parse_run(patched)
        return
    if verb == "patch" and argv[1] == "configmap":
        patch = yaml.safe_load((REPO / argv[argv.index("--patch-file") + 1]).read_text())
        assert patch["kind"] == "ConfigMap" and patch["metadata"]["name"] == argv[2], cmd
        return
    if verb == "rollout":
        kind, _, name = argv[2].partition("/")
        assert kind == "deployment" and any(o["kind"] == "Deployment" and o["metadata"]["name"] == name for o in chart_objects), cmd
        assert namespace == NAMESPACE, cmd
        return
    if verb == "delete":
        kind = argv[1]
        if kind == "retoolruns":
            assert "--all" in argv, cmd
        elif kind == "crd":
            crd = yaml.safe_load((CHART / "crds" / "retoolruns.retool.dev.yaml").read_text())
            assert argv[2] == crd["metadata"]["name"], cmd
        elif kind == "pvc":
            assert any(o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == argv[2] for o in chart_objects), cmd
        else:
            pytest.fail(f"{cmd}: kubectl delete {kind} has no check")
        return
    pytest.fail(f"{cmd}: kubectl {verb} has no check")


def test_the_docs_have_commands() -> None:
    assert len(COMMANDS) > 30
    assert {c.doc for c in COMMANDS} == set(DOCS)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: f"{c.doc}: {c.line[:70]}")
def test_command(cmd: Command, tmp_path: Path, chart_objects: list[dict[str, Any]]) -> None:
    words = shlex.split(cmd.line)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value: bash applies it (the retool runs below go through bash)
    if "|" in words:  # a pipeline: every part must be a known command
        assert {w for i, w in enumerate(words) if i == 0 or words[i - 1] == "|"} <= {"kubectl", "retool"}, cmd
        proc = bash(cmd.line)
        assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-2000:]}"
        return
    tool = words[0]
    if tool == "retool":
        check_retool(cmd, words)
    elif tool == "make":
        check_make(cmd, words, tmp_path)
    elif tool == "helm":
        check_helm(cmd, words, tmp_path)
    elif tool == "kubectl":
        check_kubectl(cmd, words, chart_objects)
    else:
        pytest.fail(f"{cmd}: no check for {tool} commands")
