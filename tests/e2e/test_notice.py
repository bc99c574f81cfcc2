"""Save on notice on the real control plane: a cordon and the cluster autoscaler's taint on the node under the
running rl stage's Ray head reach the trainer as a save request on the attempt's MLflow run.

The scheduler binds KubeRay's head pod to a kwok node; the test marks that node as going the way
``kubectl drain`` and the cluster autoscaler do, with the operator's own RBAC (it reads the node). The
trainer's side (the save at the step's end, the retry resuming from it) is the CPU rehearsal's:
tests/verl09/test_rehearsal.py.
"""

from __future__ import annotations

from typing import Any

from mlflow import MlflowClient

from retool.tracking import start_stage_run
from tests.e2e.conftest import Cluster, eventually, run_manifest

TAINT = "ToBeDeletedByClusterAutoscaler"


def test_a_cordon_and_the_autoscalers_taint_under_rl_ask_the_trainer_to_save(kube: Cluster, namespace: str) -> None:
    assert kube.apply(run_manifest("notice", namespace, sft={"enabled": False})).returncode == 0
    for stage in ("prepare", "preflight"):
        kube.wait_stage("notice", namespace, stage, "Running")
        kube.finish_pods(f"notice-{stage}-1", namespace, 0)
    rl = kube.wait_stage("notice", namespace, "rl", "Running", timeout=90)
    head = eventually("the rl Ray head bound to a node",
                      lambda: next((p for p in kube.items("pods", namespace, "-l", "ray.io/node-type=head") if p["spec"].get("nodeName")), None),
                      timeout=90)
    node = head["spec"]["nodeName"]
    mlflow_uri = kube.release["mlflow"]
    parent = eventually("the run's parent MLflow run", lambda: (kube.run_status("notice", namespace).get("mlflow") or {}).get("runId"))
    run_id = start_stage_run(mlflow_uri, parent, "rl", rl["attempt"])  # what the rl stage's trainer does when it starts
    try:
        kube.kubectl("taint", "nodes", node, f"{TAINT}=1764670000:NoSchedule", "--overwrite")  # the autoscaler marks it, then drains

        def requested() -> dict[str, Any] | None:
            entry = kube.stage("notice", namespace, "rl")
            return entry if (entry.get("saveRequest") or {}).get("delivered") else None

        entry = eventually("the rl stage's delivered save request", requested, timeout=60, show=lambda: kube.stage("notice", namespace, "rl"))
        reason = entry["saveRequest"]["reason"]
        assert reason == f"node {node} is going: the cluster autoscaler is removing it (taint {TAINT})", reason
        assert MlflowClient(mlflow_uri).get_run(run_id).data.tags["retool.saveRequest"] == reason
        events = {e["reason"]: e for e in kube.events(namespace, "notice")}
        assert "SaveRequested" in events and node in events["SaveRequested"]["message"], sorted(events)
        kube.kubectl("cordon", node)  # the drain that follows: the attempt was asked once, for the first sign
    finally:
        kube.kubectl("taint", "nodes", node, f"{TAINT}-", check=False)
        kube.kubectl("uncordon", node, check=False)
