"""The GitOps samples: Argo CD and Flux deploy runs/, a nameSuffix bump re-triggers a run, and the
pull-request workflow's commands reject a bad run. kustomize is `kubectl kustomize` (.tools/kubectl)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.spec.validate import parse_run
from tests.conftest import REPO, repo_env

GITOPS = REPO / "examples" / "gitops"
KUBECTL = REPO / ".tools" / "kubectl"


def kustomize(directory: Path) -> list[dict]:
    assert KUBECTL.is_file(), f"{KUBECTL} is missing: run `make helm` (it fetches kubectl too)"
    out = subprocess.run([str(KUBECTL), "kustomize", str(directory)], capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def copy_of_gitops(tmp_path: Path) -> Path:
    return Path(shutil.copytree(GITOPS, tmp_path / "gitops"))


def set_suffix(gitops: Path, suffix: str) -> None:
    path = gitops / "runs" / "kustomization.yaml"
    k = yaml.safe_load(path.read_text())
    k["nameSuffix"] = suffix
    path.write_text(yaml.safe_dump(k))


def test_runs_render_to_valid_retoolruns_in_the_target_namespace() -> None:
    docs = kustomize(GITOPS / "runs")
    assert docs, "runs/ renders nothing"
    for doc in docs:
        run = parse_run(doc)
        assert run.metadata.name.endswith("-a1")
        assert doc["metadata"]["namespace"] == "ml-team"


def test_bumping_the_name_suffix_re_triggers_every_run(tmp_path: Path) -> None:
    """A new suffix means new RetoolRun names (a fresh pipeline) with an unchanged spec; the old
    names disappear from the rendered set, so Argo CD / Flux prune the previous attempt."""
    before = {d["metadata"]["name"]: d["spec"] for d in kustomize(GITOPS / "runs")}
    gitops = copy_of_gitops(tmp_path)
    set_suffix(gitops, "-a2")
    after = {d["metadata"]["name"]: d["spec"] for d in kustomize(gitops / "runs")}
    assert set(before).isdisjoint(after)
    assert sorted(after) == sorted(n.removesuffix("-a1") + "-a2" for n in before)
    assert sorted(after.values(), key=str) == sorted(before.values(), key=str)


def test_argo_cd_and_flux_deploy_the_runs_directory() -> None:
    app = yaml.safe_load((GITOPS / "argocd" / "application.yaml").read_text())
    assert app["spec"]["source"]["path"] == "runs"
    assert app["spec"]["destination"]["namespace"] == "ml-team"
    assert app["spec"]["syncPolicy"]["automated"]["prune"] is True
    flux = yaml.safe_load((GITOPS / "flux" / "retool-runs.yaml").read_text())
    assert (flux["apiVersion"], flux["kind"]) == ("kustomize.toolkit.fluxcd.io/v1", "Kustomization")
    assert (GITOPS / flux["spec"]["path"] / "kustomization.yaml").is_file()
    assert flux["spec"]["prune"] is True and flux["spec"]["targetNamespace"] == "ml-team"
    source = yaml.safe_load((GITOPS / "flux" / "gitrepository.yaml").read_text())
    assert flux["spec"]["sourceRef"] == {"kind": source["kind"], "name": source["metadata"]["name"]}


def pull_request_check(gitops: Path) -> subprocess.CompletedProcess[str]:
    """The workflow's `run` steps, in order, with kubectl from .tools and the image's
    `python -m retool.cli` replaced by this checkout's (same module, same arguments)."""
    workflow = yaml.safe_load((GITOPS / "github-actions" / "validate-retoolruns.yaml").read_text())
    (job,) = workflow["jobs"].values()
    image = job["env"]["RETOOL_IMAGE"]
    assert image.startswith("retool/operator:") and not image.endswith(":latest")
    script = []
    for step in job["steps"]:
        if "run" not in step:
            continue
        command = step["run"].replace("kubectl ", f"{KUBECTL} ", 1)
        passed = re.findall(r"-e (\w+) ", command)  # the job's variables docker passes into the container
        command = re.sub(r'docker run --rm -i (-e \w+ )*--entrypoint python "\$RETOOL_IMAGE"', sys.executable, command)
        script.append(command)
    assert len(script) == 2 and sys.executable in script[1], script
    assert set(passed) == {k for k in job["env"] if k.startswith("RETOOL_OPERATOR_")}, "the operator settings reach the check"
    settings = {k: str(v) for k, v in job["env"].items() if k in passed}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=gitops, env=repo_env(**settings), capture_output=True, text=True, timeout=120)


def test_pull_request_check_passes_the_sample_runs(tmp_path: Path) -> None:
    proc = pull_request_check(copy_of_gitops(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 problem(s): all valid" in proc.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(lambda run: run["spec"].update(rl={"batchSize": 100, "miniBatchSize": 64}), "rl.batchSize", id="batch size not divisible by mini-batch"),
        pytest.param(
            lambda run: run["spec"].update(hardware={"nodes": 2}, storage={"pvc": {"accessModes": ["ReadWriteOnce"]}}),
            "storage.pvc.accessModes",
            id="two nodes on a ReadWriteOnce claim",
        ),
        pytest.param(lambda run: run["spec"]["hardware"].update(accelerator="tpu"), "hardware.accelerator", id="unknown accelerator"),
    ],
)
def test_pull_request_check_rejects_a_bad_run(tmp_path: Path, change, message: str) -> None:
    gitops = copy_of_gitops(tmp_path)
    path = gitops / "runs" / "qwen32b-h200.yaml"
    run = yaml.safe_load(path.read_text())
    change(run)
    path.write_text(yaml.safe_dump(run))
    proc = pull_request_check(gitops)
    assert proc.returncode == 1
    assert message in proc.stdout


def test_pull_request_check_rejects_a_suffix_that_makes_names_too_long(tmp_path: Path) -> None:
    gitops = copy_of_gitops(tmp_path)
    set_suffix(gitops, "-attempt-number-twenty-two-x")
    proc = pull_request_check(gitops)
    assert proc.returncode == 1
    assert "metadata.name" in proc.stdout
