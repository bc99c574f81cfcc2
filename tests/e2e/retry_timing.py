# ruff: noqa: F811  (the scenario takes test_rayjob's `ray_dashboard` fixture, imported below)
"""The scenario ``bench/bench_retry_cluster.py`` times (not collected by ``make test``: the file name is not
``test_*``; the bench passes it to pytest by path, so the e2e fixtures apply).

Per round, one run per way (a fresh cluster, then the same cluster), each with ``backoffSeconds: 0`` so the
figure is the platform's own: its sft job fails in Ray (KubeRay reads FAILED from the real Ray dashboard, as in
test_rayjob.py), and the scenario times, by polling the API server every 50 ms, from KubeRay marking attempt 1
Failed to attempt 2's submitter pod running (on a cluster, that pod runs ``ray job submit`` and the driver
starts). Figures go to the JSON file named by ``RETOOL_BENCH_OUT``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tests.e2e.conftest import Cluster, eventually
from tests.e2e.test_rayjob import _deployment_status, _kuberay_reads, _play_submitter, _rayjob_at_sft, ray_dashboard, ray_head_of_module  # noqa: F401
from tests.ray.head import RayHead

ROUNDS = int(os.environ.get("RETOOL_BENCH_ROUNDS", "3"))


def _submitter_running(kube: Cluster, namespace: str, job: str) -> bool:
    return any(p["status"].get("phase") == "Running" for p in kube.pods_of_job(job, namespace))


def _one(kube: Cluster, namespace: str, head: RayHead, name: str, same: bool) -> dict[str, Any]:
    rayjob = _rayjob_at_sft(kube, name, namespace, failurePolicy={"backoffSeconds": 0, "retryOnSameCluster": same})
    first = rayjob["metadata"]["name"]
    assert _play_submitter(kube, head, rayjob, "raise SystemExit(3)") == "FAILED"
    _kuberay_reads(kube, first, namespace, "FAILED")
    kube.finish_pods(first, namespace, 0)
    eventually("attempt 1 Failed", lambda: _deployment_status(kube, first, namespace) == "Failed", timeout=90, interval=0.05)
    failed_at = time.monotonic()
    second = f"{name}-sft-2"
    eventually("attempt 2's submitter pod running", lambda: _submitter_running(kube, namespace, second), timeout=180, interval=0.05)
    took = time.monotonic() - failed_at
    spec = (kube.get("rayjob", second, namespace) or {}).get("spec") or {}
    assert ("clusterSelector" in spec) is same, spec
    kube.kubectl("delete", "rr", name, "-n", namespace, "--wait=false")
    return {"way": "same cluster" if same else "fresh cluster", "seconds": round(took, 2)}


def test_time_from_a_failed_attempt_to_the_next_running_driver(kube: Cluster, namespace: str, ray_dashboard: RayHead) -> None:
    figures = []
    for i in range(ROUNDS):
        for same in (False, True):
            figures.append(_one(kube, namespace, ray_dashboard, f"timing-{i}-{'same' if same else 'fresh'}", same))
    out = os.environ.get("RETOOL_BENCH_OUT")
    if out:
        with open(out, "w") as handle:
            json.dump(figures, handle)
    print(json.dumps(figures))
