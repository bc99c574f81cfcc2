"""KubeRay ending a stage's RayJob from what a real Ray head says, as it does on a cluster.

KubeRay (v1.6.1, controllers/ray/rayjob_controller.go, ``JobDeploymentStatusRunning``) asks the Ray
dashboard for the job's status (``GetJobInfo`` on ``status.dashboardURL``, the head Service's DNS name,
``FetchHeadServiceURL`` in controllers/ray/utils/util.go) and, in K8sJobMode, calls the job terminal
only once its submitter Job has finished too (``isJobTerminal && finishedAt != nil``). It then marks the
RayJob Complete or Failed and, with ``shutdownAfterJobFinishes``, deletes the RayCluster after
``ttlSecondsAfterFinished``. Here the head pod is kwok's, but the dashboard is a real Ray head of the
pinned version on 127.0.0.1 (``tests/ray/head.py``), which KubeRay reaches through its private
/etc/hosts (``ControlPlane.resolve_for_kuberay``). The test plays the submitter pod: it submits the
job with KubeRay's submission id (``ray job submit --submission-id``, what the submitter runs) and
ends the pod with the exit code its ``ray job logs --follow`` would give.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, eventually, run_manifest
from tests.ray.head import HeadExitedError, RayHead, ray_head
from upstream.cluster import ControlPlane

DASHBOARD_PORT = 8265
"""KubeRay's default dashboard port, which the head Service carries (DefaultDashboardPort,
controllers/ray/utils/constant.go, v1.6.1); the operator's RayJobs do not change it."""


SUBMITTER_TRIES = 3
"""KubeRay's submitter Job runs its pod up to three times (backoffLimit 2, rayjob_controller.go v1.6.1),
each checking whether the job is already there before submitting it."""


@pytest.fixture(scope="module")
def ray_head_of_module(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    if not control_plane.kuberay_resolves_names:
        pytest.skip("KubeRay could not be given a private /etc/hosts on this machine (needs root and unshare): no Ray dashboard is reachable")
    with socket.socket() as probe:
        # SO_REUSEADDR, as the dashboard's server binds: only a listener takes the port, not the TIME_WAIT
        # connections a run just before this one left on it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", DASHBOARD_PORT))
        except OSError as err:
            pytest.fail(f"127.0.0.1:{DASHBOARD_PORT} (the head Service's dashboard port) is taken on this machine: {err}")
    with ray_head(tmp_path_factory.mktemp("ray-head"), dashboard_port=DASHBOARD_PORT) as head:  # its job API answers
        yield head


@pytest.fixture
def ray_dashboard(ray_head_of_module: RayHead) -> RayHead:
    """The module's head, started again first if it exited since (a warning says why): one head lost to a
    starved machine is one test's problem, not every later one's."""
    if why := ray_head_of_module.ensure_running():
        warnings.warn(why, stacklevel=1)
    return ray_head_of_module


def _rayjob_at_sft(kube: Cluster, run: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """Apply the run (``spec`` over ``run_manifest``'s), drive its batch stages to success; the sft RayJob once
    KubeRay has made its submitter Job."""
    assert kube.apply(run_manifest(run, namespace, **spec)).returncode == 0
    for stage in ("prepare", "preflight"):
        kube.wait_stage(run, namespace, stage, "Running")
        kube.finish_pods(f"{run}-{stage}-1", namespace, 0)
    sft = kube.wait_stage(run, namespace, "sft", "Running", "Initializing", "Queued", timeout=60)
    eventually("KubeRay's submitter Job", lambda: kube.get("job", sft["job"], namespace), timeout=90)
    return eventually("the RayJob's jobId and dashboardURL",
                      lambda: (r := kube.get("rayjob", sft["job"], namespace)) and r["status"].get("jobId") and r["status"].get("dashboardURL") and r)


def _submit(kube: Cluster, head: RayHead, rayjob: dict[str, Any], code: str, prefix: tuple[str, ...] = ()) -> str:
    """Submit the job as the submitter pod does (KubeRay's submission id); its job id.
    ``prefix``: words of the RayJob's entrypoint before its command (KubeRay passes the entrypoint after
    ``--``, common/job.go v1.6.1; Ray's CLI joins the words and its job supervisor runs them in a shell)."""
    status = rayjob["status"]
    host, _, port = status["dashboardURL"].rpartition(":")
    assert int(port) == DASHBOARD_PORT, status["dashboardURL"]
    kube.plane.resolve_for_kuberay(host)
    job_id = status["jobId"]
    failures = []
    for _ in range(SUBMITTER_TRIES):
        if why := head.ensure_running():  # the kubelet restarts the head's container; the submitter's next pod tries again
            failures.append(why)
        if _job_known(head, job_id):  # what the submitter checks first (`ray job status`, common/job.go v1.6.1)
            return job_id
        submit = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", head.url, "--submission-id", job_id, "--no-wait",
             "--", *prefix, sys.executable, "-c", code],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if submit.returncode == 0:
            return job_id
        failures.append(submit.stdout + submit.stderr)
        # The Job's next pod comes after a backoff (10 s, then 20 s); here, once the job API answers again
        # (at most 60 s: the next try then says what the job server answers).
        with contextlib.suppress(TimeoutError, HeadExitedError):  # exited: started again at the next try
            head.wait_for_jobs_api(timeout_s=60)
    pytest.fail(f"{SUBMITTER_TRIES} submissions failed, as the submitter Job's would:\n" + failures[-1][-3000:] + "\n" + head.report())


def _job_known(head: RayHead, job_id: str) -> bool:
    try:
        with urllib.request.urlopen(f"{head.url}/api/jobs/{job_id}", timeout=10) as answer:
            return answer.status == 200
    except OSError:  # 404 (HTTPError) or the job server not answering
        return False


def _verdict(head: RayHead, job_id: str) -> str:
    """Ray's verdict on the job, once it has one."""

    def verdict() -> str | None:
        try:
            with urllib.request.urlopen(f"{head.url}/api/jobs/{job_id}", timeout=5) as answer:
                state = json.load(answer)["status"]
        except OSError:  # the job API restarting (Ray's JobHead module), or the head gone: the report says which
            return None
        return state if state in ("SUCCEEDED", "FAILED", "STOPPED") else None

    return eventually(f"Ray's verdict on {job_id}", verdict, timeout=120, interval=1, show=head.report)


def _play_submitter(kube: Cluster, head: RayHead, rayjob: dict[str, Any], code: str, prefix: tuple[str, ...] = ()) -> str:
    """Submit the job as the submitter pod does and wait for Ray's verdict (``_submit``)."""
    return _verdict(head, _submit(kube, head, rayjob, code, prefix))


def _kuberay_reads(kube: Cluster, name: str, namespace: str, verdict: str) -> None:
    """Wait until KubeRay itself has read Ray's verdict from the dashboard: the test ends the
    submitter pod only then.

    On a cluster KubeRay reaches the dashboard from the start. Here it cannot until the test resolves
    the head Service's name for it (``_play_submitter``), and Go re-reads /etc/hosts only every few
    seconds. Each failed ``GetJobInfo`` is a reconcile error, so controller-runtime retries the RayJob
    with a doubling backoff: it reached 41 s in one run. KubeRay (v1.6.1, rayjob_controller.go,
    ``checkSubmitterFinishedTimeoutAndUpdateStatusIfNeeded``) then marks a RayJob whose submitter
    finished more than ``DefaultSubmitterFinishedTimeout`` (30 s) earlier Failed with reason
    ``JobDeploymentStatusTransitionGracePeriodExceeded``, without asking Ray. If the submitter ends
    inside that backoff, the outcome is decided by the harness's DNS and not by Ray. Once KubeRay has
    recorded ``status.jobStatus``, its dashboard calls succeed, and the submitter's end is decided from
    Ray, as on a cluster."""
    eventually(f"KubeRay reading {verdict} from the Ray dashboard", lambda: _status(kube, name, namespace, "jobStatus") == verdict, timeout=120)


def _status(kube: Cluster, name: str, namespace: str, field: str) -> str | None:
    """One field of the RayJob's status (None while the RayJob or the field is missing)."""
    return ((kube.get("rayjob", name, namespace) or {}).get("status") or {}).get(field)


def _deployment_status(kube: Cluster, name: str, namespace: str) -> str | None:
    return _status(kube, name, namespace, "jobDeploymentStatus")


def test_kuberay_completes_the_rayjob_from_the_ray_dashboard_deletes_its_cluster_and_the_run_goes_on(
    kube: Cluster, namespace: str, ray_dashboard: RayHead
) -> None:
    rayjob = _rayjob_at_sft(kube, "ray-ok", namespace)
    name, cluster_name = rayjob["metadata"]["name"], rayjob["status"]["rayClusterName"]
    assert _play_submitter(kube, ray_dashboard, rayjob, "print('sft done')") == "SUCCEEDED"
    _kuberay_reads(kube, name, namespace, "SUCCEEDED")
    assert _deployment_status(kube, name, namespace) == "Running", "not terminal while its submitter runs (K8sJobMode)"
    kube.finish_pods(name, namespace, 0)

    eventually("KubeRay marking the RayJob Complete", lambda: _deployment_status(kube, name, namespace) == "Complete", timeout=90)
    assert kube.get("rayjob", name, namespace)["status"]["jobStatus"] == "SUCCEEDED"
    eventually("KubeRay deleting the RayCluster (shutdownAfterJobFinishes)", lambda: kube.get("raycluster", cluster_name, namespace) is None, timeout=90)
    kube.wait_stage("ray-ok", namespace, "sft", "Succeeded")
    merge = kube.wait_stage("ray-ok", namespace, "merge", "Running", timeout=60)
    assert merge["job"] == "ray-ok-merge-1"


def test_a_ray_job_that_fails_in_ray_fails_the_rayjob_and_the_stage_retries_on_a_new_cluster(
    kube: Cluster, namespace: str, ray_dashboard: RayHead
) -> None:
    rayjob = _rayjob_at_sft(kube, "ray-bad", namespace, failurePolicy={"retryOnSameCluster": False})
    name, cluster_name = rayjob["metadata"]["name"], rayjob["status"]["rayClusterName"]
    devices = _device_pods(kube, namespace, cluster_name)
    ledger = eventually("the run's cost ledger holding the Ray cluster's device pods",
                        lambda: {p["uid"]: p for p in (kube.run_status("ray-bad", namespace).get("cost") or {}).get("pods") or []}.keys() >= devices.keys()
                        and (kube.run_status("ray-bad", namespace).get("cost") or {}).get("pods"),
                        timeout=60, show=lambda: kube.run_status("ray-bad", namespace).get("cost"))
    for use in ledger:  # the scheduler's and the API server's figures, as the pods carry them
        assert (use["devices"], use["scheduledTime"]) == devices[use["uid"]], (use, devices)
    assert _play_submitter(kube, ray_dashboard, rayjob, "raise SystemExit(3)") == "FAILED"
    _kuberay_reads(kube, name, namespace, "FAILED")
    alive_until = time.time()  # the cluster's pods run (kwok) until KubeRay deletes them, after this
    kube.finish_pods(name, namespace, 0)  # `ray job logs --follow` ends with the job, whatever its outcome

    eventually("KubeRay marking the RayJob Failed", lambda: _deployment_status(kube, name, namespace) == "Failed", timeout=90)
    assert kube.get("rayjob", name, namespace)["status"].get("reason") == "AppFailed"
    eventually("KubeRay deleting the failed attempt's RayCluster", lambda: kube.get("raycluster", cluster_name, namespace) is None, timeout=90)
    retried = eventually("attempt 2 of sft",
                         lambda: (s := kube.stage("ray-bad", namespace, "sft")).get("attempt") == 2 and s,
                         timeout=90, show=lambda: kube.stage("ray-bad", namespace, "sft"))
    assert retried["job"] == "ray-bad-sft-2"
    assert eventually("the second attempt's RayJob", lambda: kube.get("rayjob", "ray-bad-sft-2", namespace))
    # Device-hours: attempt 1's pods were deleted while they ran, so they count from their PodScheduled
    # time to the pass that found them gone: after alive_until, and before the status that settled them was read.
    lost = eventually("attempt 1 settled in the run's cost",
                      lambda: next((a for a in (kube.run_status("ray-bad", namespace).get("cost") or {}).get("attempts") or []
                                    if a["stage"] == "sft" and a["attempt"] == 1 and a.get("settledDeviceHours")), None), timeout=90)
    read_at = time.time()
    low = sum(n * (alive_until - _epoch(at)) for n, at in devices.values()) / 3600
    high = sum(n * (read_at - _epoch(at)) for n, at in devices.values()) / 3600
    assert low - 1e-5 <= lost["settledDeviceHours"] <= high + 1e-5 and lost["lost"], (low, lost, high)
    cost = kube.run_status("ray-bad", namespace)["cost"]
    assert cost["lostDeviceHours"] >= lost["deviceHours"] and not {p["uid"] for p in cost["pods"]} & devices.keys(), cost
    printed = kube.kubectl("get", "rr", "ray-bad", "-n", namespace).stdout.splitlines()
    column = printed[0].index("DEVICE-H")  # kubectl aligns its columns; PROGRESS has spaces of its own
    assert float(printed[1][column:].split()[0]) >= lost["deviceHours"] - 1e-3, printed


def _device_pods(kube: Cluster, namespace: str, cluster_name: str) -> dict[str, tuple[int, str]]:
    """The Ray cluster's pods that hold GPUs once bound: uid -> (GPUs requested, PodScheduled time)."""

    def read() -> dict[str, tuple[int, str]]:
        found = {}
        for pod in kube.items("pods", namespace, "-l", f"ray.io/cluster={cluster_name}"):
            gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", 0)) for c in pod["spec"]["containers"])
            bound = next((c["lastTransitionTime"] for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled" and c["status"] == "True"), None)
            if gpus and bound:
                found[pod["metadata"]["uid"]] = (gpus, bound)
        return found

    return eventually(f"the bound GPU pods of Ray cluster {cluster_name}", read, timeout=60)


def _epoch(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_a_rayjob_deleted_after_success_while_the_operator_is_down_still_counts_as_succeeded(
    kube: Cluster, namespace: str, ray_dashboard: RayHead
) -> None:
    """KubeRay with ``DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true`` deletes a finished RayJob itself
    (``handleShutdownAfterJobFinishes``, rayjob_controller.go v1.6.1: a plain ``Delete``); the test sends the
    same DELETE while the operator is down. The operator's finalizer keeps the RayJob, Complete and
    Terminating, until the restarted operator, which remembers nothing, has recorded the success; then the
    API server removes it. Without the finalizer the restart found it gone and reran the stage."""
    rayjob = _rayjob_at_sft(kube, "ray-held", namespace)
    name = rayjob["metadata"]["name"]
    assert "retool.dev/stage-outcome" in rayjob["metadata"].get("finalizers", []), rayjob["metadata"]
    kube.operator.stop()
    try:
        assert _play_submitter(kube, ray_dashboard, rayjob, "print('sft done')") == "SUCCEEDED"
        _kuberay_reads(kube, name, namespace, "SUCCEEDED")
        kube.finish_pods(name, namespace, 0)
        eventually("KubeRay marking the RayJob Complete", lambda: _deployment_status(kube, name, namespace) == "Complete", timeout=90)
        kube.kubectl("delete", "rayjob", name, "-n", namespace, "--wait=false")
        held = eventually("the RayJob Terminating", lambda: (r := kube.get("rayjob", name, namespace)) and r["metadata"].get("deletionTimestamp") and r)
        assert held["status"]["jobDeploymentStatus"] == "Complete"
        assert kube.stage("ray-held", namespace, "sft")["state"] == "Running", "nobody observed it yet"
    finally:
        kube.operator.start()
    sft = kube.wait_stage("ray-held", namespace, "sft", "Succeeded", timeout=60)
    assert sft["attempt"] == 1, sft
    eventually("the RayJob released and removed", lambda: kube.get("rayjob", name, namespace) is None, timeout=60)
    merge = kube.wait_stage("ray-held", namespace, "merge", "Running", timeout=60)
    assert merge["job"] == "ray-held-merge-1"
    assert kube.get("rayjob", "ray-held-sft-2", namespace) is None


def _cluster_pods(kube: Cluster, namespace: str, cluster_name: str) -> dict[str, dict[str, Any]]:
    """uid -> pod, of the Ray cluster's head and workers the API server has."""
    return {p["metadata"]["uid"]: p for p in kube.items("pods", namespace, "-l", f"ray.io/cluster={cluster_name}")}


def test_a_driver_failure_retries_on_the_same_ray_cluster_and_its_end_releases_it(kube: Cluster, namespace: str, ray_dashboard: RayHead) -> None:
    """Attempt 1's job fails in Ray on a healthy cluster: attempt 2 is a RayJob whose clusterSelector names that
    cluster, KubeRay runs its job there (its own submitter and job id), the pods are the same (uids) and are now
    attempt 2's, and when attempt 2 succeeds the operator deletes the cluster KubeRay leaves up."""
    rayjob = _rayjob_at_sft(kube, "ray-again", namespace)
    name, cluster_name = rayjob["metadata"]["name"], rayjob["status"]["rayClusterName"]
    before = eventually("the Ray cluster's running pods", lambda: (p := _cluster_pods(kube, namespace, cluster_name)) and all(
        x["status"].get("phase") == "Running" for x in p.values()) and p, timeout=60)
    assert _play_submitter(kube, ray_dashboard, rayjob, "raise SystemExit(3)") == "FAILED"
    _kuberay_reads(kube, name, namespace, "FAILED")
    kube.finish_pods(name, namespace, 0)
    eventually("KubeRay marking attempt 1 Failed", lambda: _deployment_status(kube, name, namespace) == "Failed", timeout=90)
    again = eventually("attempt 2's RayJob", lambda: kube.get("rayjob", "ray-again-sft-2", namespace), timeout=90,
                       show=lambda: kube.stage("ray-again", namespace, "sft"))
    assert again["spec"]["clusterSelector"] == {"ray.io/cluster": cluster_name} and "rayClusterSpec" not in again["spec"], again["spec"]
    assert again["spec"]["entrypoint"].startswith("RETOOL_ATTEMPT=2 "), again["spec"]["entrypoint"]
    first = kube.get("rayjob", name, namespace)["spec"]
    assert (first["shutdownAfterJobFinishes"], first.get("ttlSecondsAfterFinished", 0)) == (False, 0), first  # kept: KubeRay leaves it up
    sft = kube.stage("ray-again", namespace, "sft")
    assert sft["attempt"] == 2 and sft["rayCluster"]["name"] == cluster_name and sft["rayCluster"]["attempt"] == 2, sft
    events = " ".join(e["message"] for e in kube.events(namespace, "ray-again"))
    assert f"on the same Ray cluster {cluster_name}" in events and "kept from attempt 1" in events, events
    # KubeRay runs attempt 2 on the cluster: its own submitter Job and job id, the same dashboard.
    second = eventually("KubeRay's jobId and dashboardURL on attempt 2", lambda: (r := kube.get("rayjob", "ray-again-sft-2", namespace))
                        and r["status"].get("jobId") and r["status"].get("dashboardURL") and r, timeout=90)
    assert second["status"]["rayClusterName"] == cluster_name and second["status"]["jobId"] != rayjob["status"]["jobId"]
    after = _cluster_pods(kube, namespace, cluster_name)
    assert after.keys() == before.keys(), (sorted(before), sorted(after))  # the same pods, none made again
    assert {p["metadata"]["labels"]["retool.dev/attempt"] for p in after.values()} == {"2"}
    assert all(p["metadata"]["annotations"].get("retool.dev/attempt-since") for p in after.values())
    # The driver is told its attempt by the entrypoint (the pods' environment says attempt 1), through Ray's own path.
    prefix = second["spec"]["entrypoint"].split()[0]
    sees = "import os, sys; sys.exit(0 if os.environ['RETOOL_ATTEMPT'] == '2' else 5)"
    assert _play_submitter(kube, ray_dashboard, second, sees, prefix=(prefix,)) == "SUCCEEDED"
    _kuberay_reads(kube, "ray-again-sft-2", namespace, "SUCCEEDED")
    kube.finish_pods("ray-again-sft-2", namespace, 0)
    kube.wait_stage("ray-again", namespace, "sft", "Succeeded", timeout=90)
    eventually("the operator deleting the kept cluster (KubeRay leaves it: clusterSelector)", lambda: kube.get("raycluster", cluster_name, namespace) is None, timeout=90)
    eventually("the stage forgetting the deleted cluster", lambda: "rayCluster" not in kube.stage("ray-again", namespace, "sft"), timeout=60)
    assert kube.wait_stage("ray-again", namespace, "merge", "Running", timeout=60)["job"] == "ray-again-merge-1"
    cost = eventually("both sft attempts in the run's cost", lambda: (c := kube.run_status("ray-again", namespace).get("cost")) and {
        (a["stage"], a["attempt"]) for a in c["attempts"]} >= {("sft", 1), ("sft", 2)} and c, timeout=60)
    by_attempt = {a["attempt"]: a for a in cost["attempts"] if a["stage"] == "sft"}
    assert by_attempt[1]["lost"] and not by_attempt[2]["lost"] and by_attempt[2]["deviceHours"] > 0, cost["attempts"]


def test_a_head_replaced_while_the_job_ran_gets_the_retry_a_fresh_cluster(kube: Cluster, namespace: str, ray_dashboard: RayHead, tmp_path: Path) -> None:
    """The head pod is lost while the job runs (KubeRay makes a new one), then Ray says the job FAILED: the
    failure may be the cluster's, so attempt 2 gets a cluster of its own and the old one is deleted. (On a
    cluster a lost head usually takes the job with it, which KubeRay reports without Ray's FAILED: that path
    never keeps the cluster either; tests/operator/test_cluster_reuse.py.)"""
    rayjob = _rayjob_at_sft(kube, "ray-headless", namespace)
    name, cluster_name = rayjob["metadata"]["name"], rayjob["status"]["rayClusterName"]
    release = tmp_path / "fail-now"
    # The job waits for the test's word (a file), at most 120 s, then fails: Ray's FAILED after the head's loss.
    waits = f"import os, time\nend = time.time() + 120\nwhile not os.path.exists({str(release)!r}) and time.time() < end:\n    time.sleep(0.05)\nraise SystemExit(3)"
    job_id = _submit(kube, ray_dashboard, rayjob, waits)
    _kuberay_reads(kube, name, namespace, "RUNNING")
    started = eventually("KubeRay recording when Ray started the job",
                         lambda: ((kube.get("rayjob", name, namespace) or {}).get("status") or {}).get("rayJobInfo", {}).get("startTime"))
    # The API server's times have one-second resolution: the replacement must be made in a later second.
    eventually("a second past the job's start", lambda: time.time() >= _epoch(started) + 1.0, timeout=5, interval=0.05)
    head = next(p for p in _cluster_pods(kube, namespace, cluster_name).values() if p["metadata"]["labels"].get("ray.io/node-type") == "head")
    kube.kubectl("delete", "pod", head["metadata"]["name"], "-n", namespace, "--wait=false")
    eventually("KubeRay's new head pod", lambda: any(p["metadata"]["labels"].get("ray.io/node-type") == "head" and uid != head["metadata"]["uid"]
                                                     for uid, p in _cluster_pods(kube, namespace, cluster_name).items()), timeout=90)
    release.touch()
    assert _verdict(ray_dashboard, job_id) == "FAILED"
    _kuberay_reads(kube, name, namespace, "FAILED")
    kube.finish_pods(name, namespace, 0)
    eventually("KubeRay marking attempt 1 Failed", lambda: _deployment_status(kube, name, namespace) == "Failed", timeout=90)
    fresh = eventually("attempt 2's RayJob", lambda: kube.get("rayjob", "ray-headless-sft-2", namespace), timeout=120,
                       show=lambda: kube.stage("ray-headless", namespace, "sft"))
    assert "clusterSelector" not in fresh["spec"] and "rayClusterSpec" in fresh["spec"], fresh["spec"]
    assert "rayCluster" not in kube.stage("ray-headless", namespace, "sft")
    events = " ".join(e["message"] for e in kube.events(namespace, "ray-headless"))
    assert "attempt 2 gets a fresh Ray cluster" in events and "replaced one the failed job ran on" in events, events
    eventually("the failed attempt's cluster deleted", lambda: kube.get("raycluster", cluster_name, namespace) is None, timeout=90)
    renamed = eventually("attempt 2's own cluster", lambda: (kube.get("rayjob", "ray-headless-sft-2", namespace) or {}).get("status", {}).get("rayClusterName"), timeout=90)
    assert renamed != cluster_name
