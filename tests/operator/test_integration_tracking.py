# ruff: noqa: F811  (the tests take test_integration's `cluster` fixture, imported below)
"""End to end with a real MLflow server: eval scores reach status.results and the AIME column, and a
run's Secret value reaches none of status, the spec ConfigMap, MLflow or the logs.

The operator runs against the emulator; the eval stage's own code (``retool.stage_hooks``: the
attempt's MLflow run, ``log_eval_results`` on the per-sample dump) runs here with the environment
the operator gave the eval RayJob, as the stage pod would, with the Secret's value injected the way
the kubelet injects a ``secretKeyRef``.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from retool.recipe.render.stages import render_stage
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from retool_operator.config import OperatorConfig
from retool_operator.kube import Kind
from tests.conftest import REPO
from tests.operator.emulator import JOBS, RAYJOBS, eventually, operator_requests, running_operator
from tests.operator.helpers import job_status, rayjob_status
from tests.operator.test_integration import NS, Cluster, cluster, spec_doc  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
SECRET_VALUE = "hf_Zq8vT3secretTokenNeverToBeSeen"
SECRETS = Kind("", "v1", "secrets")
CONFIGMAPS = Kind("", "v1", "configmaps")


def eval_rows(n: int) -> list[dict[str, Any]]:
    """verl's per-sample validation dump for two AIME sets: problem p, sample i correct when (p + i) % 3 == 0."""
    rows = []
    for source, problems in (("aime_2024", 3), ("aime_2025", 2)):
        for p in range(problems):
            for i in range(n):
                correct = (p + i) % 3 == 0
                rows.append({"data_source": source, "uid": f"{source}-{p}", "prediction": str(7 if correct else i), "score": 1.0 if correct else -1.0, "acc": correct})
    return rows


def stage_env(rayjob: dict[str, Any]) -> dict[str, str]:
    """The head container's environment as the kubelet resolves it (secretKeyRef -> the Secret's value)."""
    env = {}
    for var in rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "hf-token":
            env[var["name"]] = SECRET_VALUE
    return env


def run_eval_stage(doc: dict[str, Any], rayjob: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, float]]:
    """What the eval pod does around verl: write the dump verl writes, then the stage hooks."""
    from retool import stage_hooks

    env = stage_env(rayjob)
    assert env["HF_TOKEN"] == SECRET_VALUE
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the pod's environment: the hooks must not copy the token anywhere
    run = parse_run({k: v for k, v in doc.items() if k != "status"})
    ctx = StageContext.from_env(env)
    dump = Path(run_paths(run).eval_output)
    dump.mkdir(parents=True, exist_ok=True)
    (dump / stage_hooks.EVAL_DUMP).write_text("".join(json.dumps(r) + "\n" for r in eval_rows(run.spec.eval.samples_per_problem)))
    _command, tracked = stage_hooks.start(ctx, "eval", render_stage(run, "eval", ctx))
    assert tracked is not None, "the eval stage found the parent MLflow run the operator created"
    assert stage_hooks.finish(run, ctx, "eval", tracked, 0) == 0
    return MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(tracked.run_id).data.metrics


def everything_in_mlflow(uri: str, experiment: str) -> str:
    """Params, tags and metric names of every run of the experiment, and its artifacts' text."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    out = []
    for run in client.search_runs([exp.experiment_id]):
        out += [repr(run.data.params), repr(run.data.tags), repr(sorted(run.data.metrics))]
        for artifact in _artifacts(client, run.info.run_id):
            out.append(Path(client.download_artifacts(run.info.run_id, artifact)).read_text(errors="replace"))
    return "\n".join(out)


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    files = []
    for item in client.list_artifacts(run_id, path):
        files += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return files


async def test_eval_scores_reach_status_and_a_secret_reaches_nothing(
    cluster: Cluster, mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = OperatorConfig(_env_file=None, resync_seconds=3600, mlflow_parent_runs=True, mlflow_tracking_uri=mlflow_server)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token", "namespace": NS}, "data": {"token": base64.b64encode(SECRET_VALUE.encode()).decode()}}
    await cluster.api._request("POST", SECRETS.path(NS), json=secret)
    doc = spec_doc(
        "scored",
        storage={"pvc": {"claimName": "retool-data", "mountPath": str(tmp_path / "pvc")}},
        eval={"samplesPerProblem": 4},
        tracking={"mlflow": {"experiment": "ml/scored", "registerModel": False}},
        pods={"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]},
    )
    async with running_operator(config):
        await cluster.api.create(doc)
        await cluster.finish(JOBS, "scored-prepare-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "scored-sft-1", rayjob_status("Complete", "SUCCEEDED"))
        await cluster.finish(JOBS, "scored-merge-1", job_status("Complete"))
        await cluster.finish(RAYJOBS, "scored-rl-1", rayjob_status("Complete", "SUCCEEDED"))
        rayjob = await cluster.child(RAYJOBS, "scored-eval-1", timeout=60)
        metrics = run_eval_stage(doc, rayjob, monkeypatch)
        await cluster.api.patch(RAYJOBS, NS, "scored-eval-1", rayjob_status("Complete", "SUCCEEDED"), subresource="status")

        async def scored() -> dict[str, Any] | None:
            status = await cluster.status("scored")
            return status if status.get("results") else None

        status = await eventually(scored, timeout=60, what="status.results")
        assert status["phase"] == "Succeeded"
        assert set(status["results"]) == {"aime_2024", "aime_2025"}
        assert status["results"]["aime_2024"]["mean@4"] == pytest.approx(metrics["val-core/aime_2024/acc/mean_at_4"])
        # The AIME printer column is the CRD's jsonPath .status.score: mean@n of the first eval set.
        crd = yaml.safe_load((REPO / "charts/retool/crds/retoolruns.retool.dev.yaml").read_text())
        column = next(c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == "AIME")
        assert column["jsonPath"] == ".status.score"
        assert status["score"] == pytest.approx(status["results"]["aime_2024"]["mean@4"])
        spec_map = await cluster.api.get(CONFIGMAPS, NS, "scored-prepare-1-spec")  # the prepare attempt's snapshot

    # The Secret is referenced by name in the pods and the spec, never copied anywhere.
    assert "hf-token" in yaml.safe_dump(spec_map) and "hf-token" in yaml.safe_dump(rayjob)
    children = [*await cluster.api.list(JOBS, NS), *await cluster.api.list(RAYJOBS, NS)]
    places = {
        "status": yaml.safe_dump(await cluster.status("scored")),
        "spec ConfigMap": yaml.safe_dump(spec_map),
        "children": "\n".join(yaml.safe_dump(o) for o in children),
        "MLflow": everything_in_mlflow(mlflow_server, "ml/scored"),
        "logs": caplog.text,
        "events": "\n".join(repr(r.data) for r in cluster.k8s.requests if r.resource is not None and r.resource.plural == "events"),
    }
    assert "mean_at_4" in places["MLflow"] and "scored-eval-1" in places["MLflow"], "the MLflow dump covers the runs it must"
    assert [where for where, text in places.items() if SECRET_VALUE in text] == []
    assert [r for r in operator_requests(cluster.k8s) if r[1] == "secrets"] == []  # the operator never reads a Secret


async def test_the_tool_and_text_only_pair_log_to_one_experiment(mlflow_server: str) -> None:
    """The paper's comparison as two YAMLs: both parent runs in one MLflow experiment, told apart by `recipe`."""
    from retool.tracking import ensure_parent_run as factory
    from retool_operator.tracking import ensure_parent_run

    runs = {}
    for name in ("qwen32b-h200", "qwen32b-h200-text-only"):
        doc = yaml.safe_load((REPO / "examples" / f"retoolrun-{name}.yaml").read_text())
        doc["metadata"]["uid"] = f"uid-{name}"
        runs[name] = await ensure_parent_run(parse_run(doc), mlflow_server, factory)
    tool, text = runs["qwen32b-h200"], runs["qwen32b-h200-text-only"]
    assert tool.experiment_id == text.experiment_id and tool.run_id != text.run_id
    client = MlflowClient(mlflow_server)
    assert MlflowClient(mlflow_server).get_experiment(tool.experiment_id).name == "retool/qwen32b-h200"
    params = {name: client.get_run(parent.run_id).data.params for name, parent in runs.items()}
    assert (params["qwen32b-h200"]["recipe"], params["qwen32b-h200-text-only"]["recipe"]) == ("tool-integrated", "text-only")
    assert (params["qwen32b-h200"]["rl.steps"], params["qwen32b-h200-text-only"]["rl.steps"]) == ("400", "1080")


async def test_a_reward_watch_verdict_that_lands_after_rl_ended_still_raises_reward_suspect(
    cluster: Cluster, mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's last tag write may land after the pass that sees the rl RayJob finish; a later pass reads it."""
    config = OperatorConfig(_env_file=None, resync_seconds=3600, mlflow_parent_runs=True, mlflow_tracking_uri=mlflow_server)
    message = "the second verifier's disagreement with the reward is above its benign 10% (step 400: 30 of 64 disagreed)"
    async with running_operator(config):
        await cluster.api.create(_tracked_doc("watched", tmp_path))
        tracked = await _at_rl(cluster, "watched", monkeypatch)
        await cluster.api.patch(RAYJOBS, NS, "watched-rl-1", rayjob_status("Complete", "SUCCEEDED"), subresource="status")
        await cluster.child(RAYJOBS, "watched-eval-1", timeout=60)  # the operator has passed over the end of rl
        MlflowClient(mlflow_server).set_tag(tracked.run_id, "retool.rewardSuspect", message)
        await cluster.api.patch(RAYJOBS, NS, "watched-eval-1", rayjob_status("Running", "RUNNING"), subresource="status")

        async def raised() -> dict[str, Any] | None:
            status = await cluster.status("watched")
            return next((cond for cond in status.get("conditions", []) if cond["type"] == "RewardSuspect"), None)

        cond = await eventually(raised, timeout=60, what="the RewardSuspect condition")
        assert (cond["status"], cond["message"]) == ("True", message)


async def test_a_going_node_under_rl_asks_the_trainer_to_save_and_its_answer_reaches_the_run(
    cluster: Cluster, mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Save on notice, the operator's side: the cluster autoscaler's taint on the node of the rl attempt's Ray head
    becomes ``retool.saveRequest`` on the attempt's MLflow run (where the trainer reads it each step), a
    SaveRequested Event and ``saveRequest`` in the stage's status; the trainer's ``retool.savedOnNotice`` and
    ``retool.resumedFromStep`` come back as SavedOnNotice and ResumedFromStep. The trainer's side is the CPU
    rehearsal's (tests/verl09/test_rehearsal.py)."""
    config = OperatorConfig(_env_file=None, resync_seconds=3600, mlflow_parent_runs=True, mlflow_tracking_uri=mlflow_server)
    labels = {"retool.dev/run": "noticed", "retool.dev/component": "stage", "retool.dev/stage": "rl", "retool.dev/attempt": "1", "ray.io/node-type": "head"}
    async with running_operator(config):
        await cluster.api.create(_tracked_doc("noticed", tmp_path))
        tracked = await _at_rl(cluster, "noticed", monkeypatch)
        await cluster.api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7"},
                                  "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764670000", "effect": "NoSchedule"}]}})
        await cluster.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noticed-rl-1-head", "namespace": NS, "labels": labels},
                                  "spec": {"nodeName": "gpu-7", "containers": [{"name": "ray-head", "image": "trainer"}]}, "status": {"phase": "Running"}})
        await cluster.api.patch(RAYJOBS, NS, "noticed-rl-1", rayjob_status("Running", "RUNNING"), subresource="status")  # a pass

        async def requested() -> dict[str, Any] | None:
            entry = next(s for s in (await cluster.status("noticed"))["stages"] if s["name"] == "rl")
            return entry if (entry.get("saveRequest") or {}).get("delivered") else None

        entry = await eventually(requested, timeout=30, what="the rl stage's delivered save request")
        reason = "node gpu-7 is going: the cluster autoscaler is removing it (taint ToBeDeletedByClusterAutoscaler)"
        assert entry["saveRequest"]["reason"] == reason and entry["saveRequest"]["attempt"] == 1, entry
        client = MlflowClient(mlflow_server)
        assert client.get_run(tracked.run_id).data.tags["retool.saveRequest"] == reason
        assert await eventually(lambda: _posted(cluster, "SaveRequested", "Warning"), what="the SaveRequested Event")

        client.set_tag(tracked.run_id, "retool.savedOnNotice", "3")  # the trainer's answer after verl's save
        await cluster.api.patch(RAYJOBS, NS, "noticed-rl-1", rayjob_status("Running", "RUNNING", message="step 4"), subresource="status")

        async def saved() -> dict[str, Any] | None:
            entry = next(s for s in (await cluster.status("noticed"))["stages"] if s["name"] == "rl")
            return entry if entry["saveRequest"].get("savedStep") == 3 else None

        await eventually(saved, timeout=30, what="the saved step in the rl stage's status")
        assert await eventually(lambda: _posted(cluster, "SavedOnNotice", "Normal"), what="the SavedOnNotice Event")
    sends = [r for r in operator_requests(cluster.k8s) if r[1] == "nodes"]
    assert sends and {v for _, _, v in sends} == {"get"}, sends


async def _posted(cluster: Cluster, reason: str, type_: str) -> bool:
    return any(r.data.get("reason") == reason and r.data.get("type") == type_ for r in cluster.k8s.requests if r.resource is not None and r.resource.plural == "events" and r.data)


async def _at_rl(cluster: Cluster, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Drive run ``name`` (created by the caller under a running operator) to its rl stage, and make the rl
    attempt's MLflow run as the stage's own code does (``stage_hooks.start``) with the environment the
    operator gave the RayJob. Returns the stage's tracked run."""
    from retool import stage_hooks

    await cluster.finish(JOBS, f"{name}-prepare-1", job_status("Complete"))
    await cluster.finish(RAYJOBS, f"{name}-sft-1", rayjob_status("Complete", "SUCCEEDED"))
    await cluster.finish(JOBS, f"{name}-merge-1", job_status("Complete"))
    rayjob = await cluster.child(RAYJOBS, f"{name}-rl-1", timeout=60)
    env = stage_env(rayjob)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ctx = StageContext.from_env(env)
    doc = await cluster.run(name)
    _command, tracked = stage_hooks.start(ctx, "rl", render_stage(parse_run({k: v for k, v in doc.items() if k != "status"}), "rl", ctx))
    assert tracked is not None, "the rl attempt's MLflow run, where the trainer writes its tags"
    return tracked


def _tracked_doc(name: str, tmp_path: Path) -> dict[str, Any]:
    storage = {"pvc": {"claimName": "retool-data", "mountPath": str(tmp_path / "pvc")}}
    return spec_doc(name, storage=storage, tracking={"mlflow": {"experiment": f"ml/{name}", "registerModel": False}})
