"""Every example, as our users send it: the real kubectl (its YAML reader, client-side and server-side apply),
`kubectl kustomize` for the GitOps folders and `helm template` for the chart, against the real API server with
the CRD's schema and the chart's admission webhook.

kubectl reads YAML 1.1 (sigs.k8s.io/yaml over go-yaml v2): an unquoted ``n:`` once reached the API server as
``spec.eval.false`` and every headline example was refused, while ``retool validate`` accepted them. So each
RetoolRun is also compared with what ``retool validate`` read from the same text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.spec.validate import load_documents
from tests.conftest import REPO, repo_env
from tests.e2e.conftest import HELM, Cluster, eventually

EXAMPLES = REPO / "examples"
KUSTOMIZATIONS = sorted(p.parent for p in EXAMPLES.rglob("kustomization.yaml"))
FOREIGN = {
    "gitops/argocd/application.yaml": "an Argo CD Application: its CRD is Argo CD's, not on this control plane",
    "gitops/argocd/argocd-cm-patch.yaml": "a patch of Argo CD's own ConfigMap in Argo CD's namespace",
    "gitops/flux/gitrepository.yaml": "a Flux GitRepository: Flux's CRD",
    "gitops/flux/retool-runs.yaml": "a Flux Kustomization: Flux's CRD",
    "gitops/flux/retool-smoke.yaml": "a Flux Kustomization: Flux's CRD",
    "gitops/github-actions/validate-retoolruns.yaml": "a GitHub Actions workflow, not a Kubernetes object",
}
"""Files under examples/ that are not sent to this API server, and why. Their YAML is still read by kubectl's
rules: ``test_foreign_files_read_alike_in_both_dialects``."""

REFUSED_BY_THE_CHARTS_DEFAULTS = {
    "retoolrun-qwen32b-volcano.yaml": "spec.scheduling.gang.enabled: this operator knows no batch scheduler",
}
"""Examples that need an operator set up otherwise than the chart's defaults (their header says how): the
CRD schema accepts them, and the chart's admission webhook refuses them with this message and nothing else."""

_FENCED_YAML = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


def markdown_runs() -> list[tuple[str, str]]:
    """(where, text) of every fenced YAML block of README.md and docs/ that holds a whole RetoolRun."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for block in _FENCED_YAML.finditer(doc.read_text()):
            text = block.group(1)
            if re.search(r"^kind: RetoolRun$", text, re.M) and re.search(r"^apiVersion: ", text, re.M):
                line = doc.read_text()[: block.start()].count("\n") + 2
                found.append((f"{doc.relative_to(REPO)}:{line}", text))
    return found


def applied_files() -> list[Path]:
    """The examples applied file by file: every YAML file outside FOREIGN and the kustomization folders."""
    files = sorted(p for p in EXAMPLES.rglob("*.yaml") if p.name != "kustomization.yaml")
    return [p for p in files if str(p.relative_to(EXAMPLES)) not in FOREIGN and not any(k in p.parents for k in KUSTOMIZATIONS)]


def test_every_example_file_is_covered_by_one_of_the_checks() -> None:
    """A new example lands in one of the lists below, or this fails: nothing under examples/ goes unapplied by accident."""
    every = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml")}
    kustomized = {str(p.relative_to(EXAMPLES)) for k in KUSTOMIZATIONS for p in k.rglob("*.yaml")}
    covered = {str(p.relative_to(EXAMPLES)) for p in applied_files()} | kustomized | set(FOREIGN)
    assert every == covered
    assert applied_files() and KUSTOMIZATIONS and markdown_runs()


@pytest.mark.parametrize("name", sorted(n for n in FOREIGN if not n.startswith("gitops/github-actions/")))
def test_foreign_files_read_alike_in_both_dialects(name: str) -> None:
    """What cannot reach this API server is at least read by kubectl's rules as by YAML 1.2-minded tools (the
    GitHub workflow is left out: GitHub, not kubectl, reads it, and its ``on:`` is a string there)."""
    text = (EXAMPLES / name).read_text()
    assert load_documents(text) == [d for d in yaml.safe_load_all(text) if d is not None]


def _namespaces_of(docs: list[dict[str, Any]], kube: Cluster) -> None:
    for ns in {d["metadata"].get("namespace") for d in docs} - {None}:
        if kube.kubectl("get", "namespace", ns, check=False).returncode != 0:
            kube.kubectl("create", "namespace", ns)


def _apply(kube: Cluster, text: str, *flags: str) -> subprocess.CompletedProcess:
    return kube.kubectl("apply", *flags, "-f", "-", "-o", "json", input=text, check=False, timeout=120)


def _items(out: str) -> list[dict[str, Any]]:
    obj = json.loads(out)
    return obj["items"] if obj.get("kind") == "List" else [obj]


def contains(stored: Any, written: Any) -> bool:
    """Whether ``stored`` holds everything ``written`` says (the API server adds the schema's defaults)."""
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(k in stored and contains(stored[k], v) for k, v in written.items())
    if isinstance(written, list):
        return isinstance(stored, list) and len(stored) == len(written) and all(map(contains, stored, written))
    return stored == written and type(stored) is type(written)


def _check_runs(kube: Cluster, where: str, text: str, refusal: str | None = None) -> None:
    """Client-side apply, server-side apply (each server dry-run, then for real), and the spec kubectl sent
    equal to the spec `retool validate` read. With ``refusal``: each apply is refused by the chart's webhook
    with that message, and by nothing else."""
    ours = [d for d in load_documents(text)]
    _namespaces_of(ours, kube)
    client = kube.kubectl("create", "--dry-run=client", "-f", "-", "-o", "json", input=text, check=False)
    assert client.returncode == 0, f"{where}: kubectl could not read it: {client.stderr}"
    assert [d.get("spec") for d in _items(client.stdout)] == [d.get("spec") for d in ours], f"{where}: kubectl and retool validate read it differently"
    for flags in (("--dry-run=server",), ("--server-side", "--dry-run=server"), (), ("--server-side", "--force-conflicts")):
        proc = _apply(kube, text, *flags)
        if refusal is not None:
            assert proc.returncode != 0 and 'admission webhook "validate.retoolruns.retool.dev" denied' in proc.stderr, proc.stderr
            assert f"invalid RetoolRun: {refusal}" in proc.stderr and proc.stderr.count("spec.") == 1, proc.stderr
            continue
        assert proc.returncode == 0, f"{where}: kubectl apply {' '.join(flags)} refused it:\n{proc.stderr}"
    for doc in ours if refusal is None else []:
        if doc.get("kind") == "RetoolRun":
            name, ns = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
            stored = eventually(f"{ns}/{name} stored", lambda: kube.get("retoolrun", name, ns))  # noqa: B023
            assert contains(stored["spec"], doc["spec"]), f"{where}: the API server stored another spec: {stored['spec']}"
            # Gone with its children before the next scenario: a run's stage pods hold the kwok nodes'
            # CPUs and GPUs that later modules' Ray heads need (a test_stalls head once found none).
            kube.kubectl("delete", "retoolrun", name, "-n", ns, "--cascade=foreground", "--timeout=120s")
            kube.kubectl("wait", "--for=delete", "pods", "-l", f"retool.dev/run={name}", "-n", ns, "--timeout=120s", check=False)


@pytest.mark.parametrize("path", applied_files(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_an_example_file_applies_with_kubectl(kube: Cluster, path: Path) -> None:
    _check_runs(kube, str(path.relative_to(REPO)), path.read_text(), REFUSED_BY_THE_CHARTS_DEFAULTS.get(path.name))


@pytest.mark.parametrize(("where", "text"), markdown_runs(), ids=[w for w, _ in markdown_runs()])
def test_a_retoolrun_in_the_docs_applies_with_kubectl(kube: Cluster, where: str, text: str) -> None:
    _check_runs(kube, where, text)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_a_gitops_folder_builds_with_kubectl_kustomize_and_applies(kube: Cluster, folder: Path) -> None:
    built = kube.kubectl("kustomize", str(folder), check=False)
    assert built.returncode == 0, built.stderr
    _check_runs(kube, f"kubectl kustomize {folder.relative_to(REPO)}", built.stdout)


def test_the_chart_renders_and_the_api_server_accepts_it(kube: Cluster) -> None:
    """`helm template` (CRDs included; KubeRay's API named as the chart's own error message says) through
    server-side dry-run: every object the chart makes is valid to this API server."""
    ns = "chart-dry-run"
    kube.kubectl("create", "namespace", ns, check=False)
    rendered = subprocess.run([str(HELM), "template", "retool-dry", str(REPO / "charts" / "retool"), "-n", ns, "--include-crds",
                               "--api-versions", "ray.io/v1/RayJob"],  # KubeRay's API is served here; helm template cannot ask
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    proc = kube.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=retool-e2e-dry-run", "-n", ns, "-f", "-",
                        input=rendered.stdout, check=False, timeout=180)
    assert proc.returncode == 0, proc.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "ConfigMap"} <= kinds


def test_the_former_eval_n_is_refused_by_the_api_server_and_by_retool_validate_alike(kube: Cluster) -> None:
    """kubectl sends an unquoted ``n:`` as ``false:``: the API server's strict decoding refuses that unknown field,
    and `retool validate` refuses the same text naming the new key, before anything reaches a cluster."""
    text = (EXAMPLES / "retoolrun-minimal.yaml").read_text().replace("name: minimal", "name: former-n") + "  eval:\n    n: 4\n"
    proc = _apply(kube, text, "--dry-run=server")
    assert proc.returncode != 0 and 'unknown field "spec.eval.false"' in proc.stderr, proc.stderr
    validated = subprocess.run([sys.executable, "-m", "retool.cli", "validate", "-"], input=text, capture_output=True, text=True,
                               env=repo_env(), timeout=120)
    assert validated.returncode == 1
    assert "spec.eval: eval.n (which kubectl's YAML 1.1 reads as the key false) was renamed to eval.samplesPerProblem" in validated.stdout
