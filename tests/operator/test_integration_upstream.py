# ruff: noqa: F811  (the tests take test_integration's `cluster` fixture, imported below)
"""The real operator against the emulator, with KubeRay's, Kueue's and Kubernetes' controllers played as
their upstream sources do it (``tests/operator/kuberay.py``, ``tests/operator/kueue.py``); each test
names the upstream behaviour it plays. Every test ends with the RBAC check of ``test_integration``'s
fixture.
"""

from __future__ import annotations

from typing import Any

import pytest

from retool_operator import below
from retool_operator import constants as c
from retool_operator.kube import KINDS
from tests.operator.emulator import JOBS, RAYJOBS, RUNS, TEST_AGENT, eventually, running_operator
from tests.operator.helpers import job_status
from tests.operator.kuberay import PODS, RAYCLUSTERS, FakeKubeRay
from tests.operator.test_integration import NS, Cluster, cluster, spec_doc, stage_of  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


async def _to_sft(cluster: Cluster, name: str, **spec: Any) -> FakeKubeRay:
    kuberay = FakeKubeRay(cluster.api, NS)
    await cluster.api.create(spec_doc(name, **spec))
    await cluster.finish(JOBS, f"{name}-prepare-1", job_status("Complete"))
    await cluster.child(RAYJOBS, f"{name}-sft-1")
    await kuberay.start(f"{name}-sft-1")
    return kuberay


async def test_a_hung_submitter_of_a_failed_rayjob_does_not_hold_the_next_attempt(cluster: Cluster) -> None:
    """KubeRay v1.7.0 rayjob_controller.go: a RayJob turns Failed (here on its deadline) while its
    submitter still follows the log; the cluster is deleted, the submitter Job is kept, and with the
    default submitter backoffLimit (2) its failed pod is replaced by one that waits for the deleted
    head's GCS forever. Attempt 2 must start anyway."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "hung", failurePolicy={"maxRetries": 1, "backoffSeconds": 1, "stageDeadlineSeconds": 3600})
        sft = await cluster.api.get(RAYJOBS, NS, "hung-sft-1")
        assert sft is not None and sft["spec"]["submitterConfig"] == {"backoffLimit": 0}
        await kuberay.end("hung-sft-1", "Failed", "RUNNING", hung_submitter=True, message="DeadlineExceeded")
        # The hung pod is still Running: it holds neither accelerators nor the checkpoint directory.
        await cluster.child(RAYJOBS, "hung-sft-2", timeout=15)
        # Its pod then fails; the submitter Job makes no replacement (backoffLimit 0).
        assert await kuberay.submitter_pod_fails("hung-sft-1", "hung-sft-1-submit-0") is None
        status = await cluster.status("hung")
        assert stage_of(status, "sft")["attempt"] == 2 and "waiting for the pods" not in (stage_of(status, "sft").get("message") or "")


async def test_the_next_stage_waits_for_ray_pods_but_not_for_the_submitter(cluster: Cluster) -> None:
    """The cluster's pods are waited for (they hold the GPUs); a submitter pod left running is not."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "order")
        await cluster.api.patch(RAYJOBS, NS, "order-sft-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}, subresource="status")

        async def waiting() -> dict[str, Any] | None:
            status = await cluster.status("order")
            merge = stage_of(status, "merge")
            return status if "order-sft-1-head-x1" in (merge.get("message") or "") else None

        status = await eventually(waiting, what="merge waiting for sft's head pod")
        assert "order-sft-1-submit-0" not in stage_of(status, "merge")["message"]
        await kuberay.end("order-sft-1", "Complete", "SUCCEEDED", hung_submitter=True)
        await cluster.child(JOBS, "order-merge-1")
        pod = await cluster.api.get(PODS, NS, "order-sft-1-submit-0")
        assert pod is not None and pod["status"]["phase"] == "Running"


async def test_kueues_default_local_queue_takes_an_unqueued_run_and_the_operator_does_not_fight_it(cluster: Cluster) -> None:
    """Kueue's defaulting webhook labels and suspends the unqueued run's Job (a LocalQueue named
    ``default``); the operator shows it Queued and never writes its ``suspend``; Kueue admits it."""
    from tests.operator.kueue import FakeKueue, default_local_queue
    from tests.operator.test_integration_cluster import stage_state, suspend_patches

    cluster.k8s.mutations = [default_local_queue]
    kueue = FakeKueue(cluster.api, NS)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("defaulted"))
        job = await cluster.child(JOBS, "defaulted-prepare-1")
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default" and job["spec"]["suspend"] is True
        await kueue.workload_of(JOBS, "defaulted-prepare-1")
        status = await stage_state(cluster, "defaulted", "prepare", "Queued")
        assert "Kueue queue default" in stage_of(status, "prepare")["message"]
        await kueue.admit(JOBS, "defaulted-prepare-1")
        await stage_state(cluster, "defaulted", "prepare", "Running")
    assert suspend_patches(cluster, "jobs") == [], "the operator wrote suspend of a child Kueue manages"
    assert not any((r.data or {}).get("reason") == "Resumed" for r in cluster.k8s.requests if r.resource is not None and r.resource.plural == "events")


# ---------------------------------------------------------------- edits of a running run (no webhook on the emulator)

CONFIGMAPS_KIND = KINDS[("v1", "ConfigMap")]


async def _spec_valid(cluster: Cluster, name: str, want: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await cluster.status(name)
        cond = next((c for c in status.get("conditions", []) if c["type"] == "SpecValid"), None)
        return status if cond is not None and cond["status"] == want else None

    return await eventually(probe, what=f"{name} SpecValid {want}")


async def _edit(cluster: Cluster, name: str, generation: int, spec: dict[str, Any]) -> None:
    """A spec edit as the API server stores it: metadata.generation moves with every spec change."""
    await cluster.api.patch(RUNS, NS, name, {"metadata": {"generation": generation}, "spec": spec})


async def test_an_edit_to_a_started_stage_is_held_without_the_webhook_and_never_reaches_its_child(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("frozen"))
        await cluster.finish(JOBS, "frozen-prepare-1", job_status("Complete"))
        sft = await cluster.child(RAYJOBS, "frozen-sft-1")
        volumes = sft["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
        assert {"name": "run-spec", "configMap": {"name": "frozen-sft-1-spec"}} in volumes
        snapshot = await cluster.child(CONFIGMAPS_KIND, "frozen-sft-1-spec")

        await _edit(cluster, "frozen", 2, {"sft": {"epochs": 1}})
        status = await _spec_valid(cluster, "frozen", "False")
        conds = {c["type"]: c for c in status["conditions"]}
        assert conds["SpecValid"]["reason"] == "ImmutableFieldChanged" and "spec.sft" in conds["SpecValid"]["message"]
        assert conds["Stalled"]["status"] == "True" and status["phase"] == "SFT"
        assert (await cluster.api.get(CONFIGMAPS_KIND, NS, "frozen-sft-1-spec"))["data"] == snapshot["data"]

        # The running child is still observed; nothing new starts while the edit is held.
        await cluster.finish(RAYJOBS, "frozen-sft-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}})

        async def sft_done() -> bool:
            return stage_of(await cluster.status("frozen"), "sft")["state"] == "Succeeded"

        await eventually(sft_done, what="sft success recorded while the edit is held")
        assert await cluster.api.get(JOBS, NS, "frozen-merge-1") is None

        await _edit(cluster, "frozen", 3, {"sft": {"epochs": None}})  # reverted
        await _spec_valid(cluster, "frozen", "True")
        await cluster.child(JOBS, "frozen-merge-1")


async def test_an_edit_that_makes_the_spec_invalid_does_not_stop_observing_the_running_stage(cluster: Cluster) -> None:
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("broken"))
        await cluster.finish(JOBS, "broken-prepare-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "broken-sft-1")
        await cluster.child(CONFIGMAPS_KIND, "broken-sft-1-spec")
        await _edit(cluster, "broken", 2, {"rl": {"miniBatchSize": 1024}})
        status = await _spec_valid(cluster, "broken", "False")
        assert status["phase"] == "SFT" and "miniBatchSize" in status["message"]
        await cluster.finish(RAYJOBS, "broken-sft-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}})

        async def sft_done() -> bool:
            return stage_of(await cluster.status("broken"), "sft")["state"] == "Succeeded"

        await eventually(sft_done, what="sft success recorded under an invalid edit")
        assert (await cluster.status("broken"))["phase"] != "Failed"


async def test_a_succeeded_rayjob_kuberay_deletes_right_after_complete_is_not_rerun(cluster: Cluster) -> None:
    """KubeRay with DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true (rayjob_controller.go v1.7.0) deletes the
    RayJob itself once it is Complete and ttlSecondsAfterFinished (0) has passed: the stage succeeded.

    The worst order is forced: a pass reads the RayJob gone before the watch has delivered its Complete
    (the read answers 404 from then on). The stage waits for the watch instead of failing the attempt."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "gone")
        answered_gone: list[str] = []

        def already_deleted(request: Any) -> tuple[int, str] | None:
            """KubeRay deletes within milliseconds of Complete: every read of the operator comes after it."""
            fetch = request.action is not None and request.action.value == "FETCH" and request.resource.plural == "rayjobs"
            if fetch and request.name == "gone-sft-1" and request.headers.get("User-Agent") != TEST_AGENT:
                answered_gone.append(request.name)
                return 404, "not found"
            return None

        cluster.k8s.refusals.append(already_deleted)
        # A watch event on the RayJob (its labels edited) makes a pass that reads it gone while it is still Running.
        await cluster.api.patch(RAYJOBS, NS, "gone-sft-1", {"metadata": {"annotations": {"poke": "1"}}})
        await eventually(lambda: _true(bool(answered_gone)), what="a pass that read the RayJob gone")
        sft = stage_of(await cluster.status("gone"), "sft")
        assert (sft["state"], sft["attempt"]) == ("Running", 1), sft
        await kuberay.end("gone-sft-1", "Complete", "SUCCEEDED")
        await kuberay.delete_finished("gone-sft-1")
        await cluster.child(JOBS, "gone-merge-1")
        status = await cluster.status("gone")
        assert (stage_of(status, "sft")["state"], stage_of(status, "sft")["attempt"]) == ("Succeeded", 1)
        assert await cluster.api.get(RAYJOBS, NS, "gone-sft-2") is None


async def _true(value: bool) -> bool:
    return value


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.api.get(RAYJOBS, NS, name) is None


async def test_a_rayjob_kuberay_deleted_after_success_while_the_operator_was_down_still_counts_as_succeeded(cluster: Cluster) -> None:
    """The operator's finalizer (``retool.dev/stage-outcome``) holds a stage's RayJob until the run's status
    has its outcome: KubeRay deleting it (DELETE_RAYJOB_CR_AFTER_JOB_FINISHES) while the operator is down
    leaves it Terminating with its Complete status, and the restarted operator, which remembers nothing,
    records success from it and then lets it go. Without the finalizer the restart found it gone and
    reran the stage as "deleted outside the operator"."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "down")
        created = await cluster.api.get(RAYJOBS, NS, "down-sft-1")
        assert created is not None and created["metadata"].get("finalizers") == [c.FINALIZER_OUTCOME]
    await kuberay.end("down-sft-1", "Complete", "SUCCEEDED")
    await kuberay.delete_finished("down-sft-1")
    held = await cluster.api.get(RAYJOBS, NS, "down-sft-1")
    assert held is not None and held["metadata"].get("deletionTimestamp"), "held by the finalizer while the operator is down"
    async with running_operator(cluster.config):
        await cluster.child(JOBS, "down-merge-1")
        sft = stage_of(await cluster.status("down"), "sft")
        assert (sft["state"], sft["attempt"]) == ("Succeeded", 1), sft
        await eventually(lambda: _gone(cluster, "down-sft-1"), what="the finalizer released once success was recorded")
    assert await cluster.api.get(RAYJOBS, NS, "down-sft-2") is None


async def test_a_running_rayjob_deleted_outside_the_operator_fails_its_attempt_and_is_let_go(cluster: Cluster) -> None:
    """Held by the finalizer, a RayJob deleted while it runs would look alive forever: being deleted before it
    finished counts as deleted outside the operator (a failed attempt), and the finalizer goes once the
    status has moved on."""
    async with running_operator(cluster.config):
        await _to_sft(cluster, "cut", failurePolicy={"maxRetries": 0})
        await cluster.api._request("DELETE", RAYJOBS.path(NS, "cut-sft-1"))
        status = await cluster.phase_is("cut", "Failed")
        sft = stage_of(status, "sft")
        assert (sft["state"], sft["attempt"]) == ("Failed", 1), sft
        assert "its RayJob cut-sft-1 is being deleted outside the operator" in (sft.get("message") or ""), sft
        await eventually(lambda: _gone(cluster, "cut-sft-1"), what="the deleted attempt let go")


async def test_the_rayjobs_of_a_deleted_run_are_let_go_even_when_it_was_deleted_while_the_operator_was_down(cluster: Cluster) -> None:
    """The garbage collector deletes a deleted run's RayJobs; the finalizer must not keep them (and their Ray
    clusters) once the run is gone, including when the operator was down at the time: kopf hands every
    existing RayJob to the event handler when the operator starts."""
    async with running_operator(cluster.config):
        await _to_sft(cluster, "bye")
    await cluster.api._request("DELETE", RUNS.path(NS, "bye"))
    await cluster.api._request("DELETE", RAYJOBS.path(NS, "bye-sft-1"))  # the garbage collector, for the emulator
    async with running_operator(cluster.config):
        await eventually(lambda: _gone(cluster, "bye-sft-1"), what="the deleted run's RayJob let go")


# ---------------------------------------------------------------- the outcome finalizer (issue 50, item 7)

FOREGROUND = "foregroundDeletion"
"""The finalizer the API server puts on an object deleted with ``propagationPolicy: Foreground``
(``metav1.FinalizerDeleteDependents``; ``kubectl delete --cascade=foreground``, and Argo CD's default when
it prunes): the object stays, with its deletionTimestamp, until the garbage collector has deleted every
dependent whose owner reference has ``blockOwnerDeletion`` (the stage children's have), and then removes
it (pkg/controller/garbagecollector/garbagecollector.go ``processDeletingDependentsItem``, Kubernetes v1.36.3)."""


def _operator_releases(cluster: Cluster, rayjob: str) -> list[int]:
    """Positions in the emulator's history of the operator's patches that remove the outcome finalizer of ``rayjob``."""
    return [
        i
        for i, r in enumerate(cluster.k8s.requests)
        if r.resource is not None and r.resource.plural == "rayjobs" and r.name == rayjob and r.headers.get("User-Agent") != TEST_AGENT
        and r.action is not None and r.action.value == "UPDATE" and "finalizers" in ((r.data or {}).get("metadata") or {})
    ]  # fmt: skip


async def test_a_run_deleted_in_the_foreground_lets_its_running_rayjob_go_while_the_run_waits_for_it(cluster: Cluster) -> None:
    """Deleting a run whose sft RayJob runs: the garbage collector deletes the RayJob first and keeps the run
    (``FOREGROUND``) until it is gone. The outcome finalizer must go as soon as the run is being deleted: held
    until the run is gone, neither would ever go (and the Ray cluster would keep its GPUs)."""
    async with running_operator(cluster.config):
        await _to_sft(cluster, "fg")
        run = await cluster.run("fg")
        # The API server, for DELETE with propagationPolicy Foreground: the finalizer, then the deletionTimestamp.
        await cluster.api.patch(RUNS, NS, "fg", {"metadata": {"finalizers": [*run["metadata"].get("finalizers", []), FOREGROUND]}})
        await cluster.api._request("DELETE", RUNS.path(NS, "fg"))

        async def only_the_collectors_finalizer_left() -> bool:
            return (await cluster.run("fg"))["metadata"].get("finalizers") == [FOREGROUND]

        await eventually(only_the_collectors_finalizer_left, what="kopf's finalizer removed from the run being deleted")
        await cluster.api._request("DELETE", RAYJOBS.path(NS, "fg-sft-1"))  # the garbage collector deletes the dependent
        await eventually(lambda: _gone(cluster, "fg-sft-1"), timeout=10, what="the running RayJob of a run being deleted let go")
        run = await cluster.run("fg")
        assert run["metadata"].get("deletionTimestamp") and run["metadata"]["finalizers"] == [FOREGROUND], "the run waited for its RayJob"
        await cluster.api.patch(RUNS, NS, "fg", {"metadata": {"finalizers": []}})  # no dependent left: the collector lets the run go
        assert await cluster.api.get(RUNS, NS, "fg") is None


async def test_the_previous_attempts_rayjob_deleted_during_the_next_attempt_is_let_go(cluster: Cluster) -> None:
    """KubeRay with DELETE_RAYJOB_CR_AFTER_JOB_FINISHES deletes a finished RayJob once its
    ttlSecondsAfterFinished (the run's clusterGraceSeconds) has passed (rayjob_controller.go v1.7.0): for a
    failed attempt that is often while the next attempt runs. Its outcome was recorded when the retry began,
    so its finalizer must go, though no pass follows that child any more."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "twice", failurePolicy={"maxRetries": 1, "backoffSeconds": 1})
        await kuberay.end("twice-sft-1", "Complete", "FAILED", message="Job entrypoint command failed with exit code 1")
        await cluster.child(RAYJOBS, "twice-sft-2", timeout=15)
        await kuberay.start("twice-sft-2")
        await kuberay.delete_finished("twice-sft-1")
        await eventually(lambda: _gone(cluster, "twice-sft-1"), timeout=10, what="the failed attempt's RayJob let go")
        sft = stage_of(await cluster.status("twice"), "sft")
        assert (sft["state"], sft["attempt"], sft["job"]) == ("Running", 2, "twice-sft-2"), sft
        held = await cluster.api.get(RAYJOBS, NS, "twice-sft-2")
        assert held is not None and c.FINALIZER_OUTCOME in held["metadata"]["finalizers"] and not held["metadata"].get("deletionTimestamp")


async def test_a_deleted_rayjobs_finalizer_goes_only_once_its_outcome_is_in_the_runs_status(cluster: Cluster) -> None:
    """The finalizer exists so that the outcome outlives the RayJob: it may go only after a status write that
    records it. Here KubeRay deletes the succeeded RayJob while the operator is down, and the restarted
    operator cannot write the run's status at first (its ServiceAccount's RBAC is being reinstalled, e.g. by
    a helm upgrade): the RayJob must stay held until a status write records sft Succeeded, and only then go."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "kept")
    await kuberay.end("kept-sft-1", "Complete", "SUCCEEDED")
    await kuberay.delete_finished("kept-sft-1")
    refused: list[Any] = []
    denied = (
        'retoolruns.retool.dev "kept" is forbidden: User "system:serviceaccount:retool-system:retool-operator" cannot patch resource'
        ' "retoolruns/status" in API group "retool.dev" in the namespace "ml"'
    )  # the RBAC authorizer's words (k8s.io/apiserver pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage, v1.36.3)

    def status_forbidden(request: Any) -> tuple[int, str] | None:
        if (request.resource.plural, request.name, request.subresource) == ("retoolruns", "kept", "status") and request.headers.get("User-Agent") != TEST_AGENT:
            refused.append(request)
            return 403, denied
        return None

    cluster.k8s.refusals.append(status_forbidden)
    async with running_operator(cluster.config):
        await eventually(lambda: _true(bool(refused)), what="a pass that could not write the outcome")
        held = await cluster.api.get(RAYJOBS, NS, "kept-sft-1")
        assert held is not None and held["metadata"].get("finalizers") == [c.FINALIZER_OUTCOME], "let go before its outcome was written"
        cluster.k8s.refusals.remove(status_forbidden)  # RBAC back
        # The next watch event on the RayJob (KubeRay updates it) runs a pass that can write the status.
        await cluster.api.patch(RAYJOBS, NS, "kept-sft-1", {"metadata": {"annotations": {"poke": "1"}}})
        await cluster.child(JOBS, "kept-merge-1")
        await eventually(lambda: _gone(cluster, "kept-sft-1"), timeout=10, what="the RayJob let go once its outcome was written")
    sft = stage_of(await cluster.status("kept"), "sft")
    assert (sft["state"], sft["attempt"]) == ("Succeeded", 1), sft
    history = cluster.k8s.requests
    refused_ids = {id(r) for r in refused}
    recorded = [
        i
        for i, r in enumerate(history)
        if r.resource is not None and r.resource.plural == "retoolruns" and r.subresource == "status" and r.headers.get("User-Agent") != TEST_AGENT
        and id(r) not in refused_ids and any(s.get("name") == "sft" and s.get("state") == "Succeeded" for s in ((r.data or {}).get("status") or {}).get("stages") or [])
    ]  # fmt: skip
    releases = _operator_releases(cluster, "kept-sft-1")
    assert recorded and releases, (recorded, releases)
    assert min(releases) > min(recorded), "the finalizer was removed before a status write recorded the outcome"


async def test_a_workload_kueue_deactivates_fails_the_stage_instead_of_queueing_forever(cluster: Cluster) -> None:
    from tests.operator.kueue import FakeKueue

    kueue = FakeKueue(cluster.api, NS)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("requeued", scheduling={"queueName": "team-a"}, failurePolicy={"maxRetries": 0}))
        await cluster.child(JOBS, "requeued-prepare-1")
        await kueue.admit(JOBS, "requeued-prepare-1")
        await kueue.give_up(JOBS, "requeued-prepare-1")
        status = await cluster.phase_is("requeued", "Failed")
        message = stage_of(status, "prepare")["message"]
        assert "Kueue deactivated its workload" in message and "re-queuing retries" in message
        assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "True"


# ---------------------------------------------------------------- refusals below the operator

EVENTS_KIND = KINDS[("v1", "Event")]
FORBIDDEN = 'pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "stage")'
QUOTA = (
    'pods "quota-sft-1-head-x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, '
    "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4"
)


async def _controller_event(cluster: Cluster, kind: str, name: str, reason: str, message: str) -> None:
    """A Warning Event as the Job controller (FailedCreate) or the volume controller (ProvisioningFailed) records it."""
    await cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{reason.lower()}", "namespace": NS},
            "involvedObject": {"kind": kind, "name": name, "namespace": NS},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "lastTimestamp": "2026-01-01T00:00:00Z",
        }
    )


async def _stalled(cluster: Cluster, name: str, fragment: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = await cluster.status(name)
        cond = next((c for c in status.get("conditions", []) if c["type"] == "Stalled"), None)
        return status if cond is not None and cond["status"] == "True" and fragment in cond["message"] else None

    return await eventually(probe, what=f"{name} Stalled with {fragment!r}")


async def test_pods_the_job_controller_cannot_create_stall_the_run_visibly(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod Security admission refuses the Job's pod: the Job controller records FailedCreate Events
    (pkg/controller/job/job_controller.go, Kubernetes v1.36.3) and the Job stays active with 0 pods."""
    from tests.operator.test_integration import FAST, _warned

    monkeypatch.setattr(below, "EVENTS_AFTER_SECONDS", 0.0)  # a Job's Events are read only once it is not brand new
    async with running_operator(FAST):
        await cluster.api.create(spec_doc("denied"))
        await cluster.child(JOBS, "denied-prepare-1")
        await _controller_event(cluster, "Job", "denied-prepare-1", "FailedCreate", f"Error creating: {FORBIDDEN}")
        status = await _stalled(cluster, "denied", "violates PodSecurity")
        assert status["phase"] == "Preparing" and stage_of(status, "prepare")["state"] == "Running"
        await eventually(lambda: _warned(cluster, {"ChildRefused"}), what="a ChildRefused Warning Event")


async def test_ray_pods_kuberay_cannot_create_stall_the_run_visibly(cluster: Cluster) -> None:
    """KubeRay's RayCluster ReplicaFailure condition, copied into the RayJob while it waits for its cluster."""
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("quota"))
        await cluster.finish(JOBS, "quota-prepare-1", job_status("Complete"))
        condition = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateHeadPod", "message": QUOTA}
        await cluster.finish(RAYJOBS, "quota-sft-1", {"status": {"jobDeploymentStatus": "Initializing", "rayClusterStatus": {"conditions": [condition]}}})
        status = await _stalled(cluster, "quota", "FailedCreateHeadPod: pods \"quota-sft-1-head-x\" is forbidden: exceeded quota")
        assert status["phase"] == "SFT"


async def test_a_claim_the_storage_class_cannot_provision_says_so(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReadWriteMany claim on a block-only default class stays Pending with ProvisioningFailed Events
    (pkg/controller/volume/events/event.go, Kubernetes v1.36.3)."""
    from tests.operator.test_integration import FAST

    monkeypatch.setattr(below, "EVENTS_AFTER_SECONDS", 0.0)
    async with running_operator(FAST):
        await cluster.api.create(spec_doc("blocky", hardware={"nodes": 2}, storage={"pvc": {"claimName": None}}))
        claim = await cluster.child(KINDS[("v1", "PersistentVolumeClaim")], "blocky-data")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        message = 'failed to provision volume with StorageClass "standard": rpc error: access mode ReadWriteMany is not supported'
        await _controller_event(cluster, "PersistentVolumeClaim", "blocky-data", "ProvisioningFailed", message)
        status = await _stalled(cluster, "blocky", "cannot be provisioned")
        storage = next(c for c in status["conditions"] if c["type"] == "StorageReady")
        assert (storage["status"], storage["reason"]) == ("False", "ProvisioningFailed") and "ReadWriteMany is not supported" in storage["message"]


async def test_the_sandbox_is_down_while_its_stage_waits_in_the_queue_and_after_the_run_even_with_an_hpa(cluster: Cluster) -> None:
    """The HPA controller never scales a target at zero (ScalingDisabled, pkg/controller/podautoscaler/horizontal.go,
    Kubernetes v1.36.3): the operator writes zero when nothing needs the sandbox, lifts it to the HPA's
    minReplicas once when a stage needs it, then leaves it to the HPA."""
    from tests.operator.kueue import FakeKueue
    from tests.operator.test_integration import DEPLOYMENTS, FAST, _replicas

    kueue = FakeKueue(cluster.api, NS)
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "scaled-sandbox", "namespace": NS}}
    hpa["spec"] = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled-sandbox"}, "minReplicas": 3, "maxReplicas": 9}
    await cluster.api.create(hpa)
    async with running_operator(FAST):
        await cluster.api.create(spec_doc("scaled", scheduling={"queueName": "team-a"}, sft={"enabled": False}))
        await cluster.child(JOBS, "scaled-prepare-1")
        await kueue.admit(JOBS, "scaled-prepare-1")
        await cluster.finish(JOBS, "scaled-prepare-1", job_status("Complete"))
        await cluster.child(RAYJOBS, "scaled-rl-1")
        await stage_state_is(cluster, "scaled", "rl", "Queued")
        assert await _replicas(cluster, "scaled-sandbox", 0)  # waiting for admission: nothing calls it
        await kueue.admit(RAYJOBS, "scaled-rl-1")
        await eventually(lambda: _replicas(cluster, "scaled-sandbox", 3), what="lifted to the HPA's minReplicas")
        await cluster.api.patch(DEPLOYMENTS, NS, "scaled-sandbox", {"spec": {"replicas": 5}})  # the HPA scales up
        await kueue.preempt(RAYJOBS, "scaled-rl-1")
        await eventually(lambda: _replicas(cluster, "scaled-sandbox", 0), what="zero while preempted")
        await kueue.admit(RAYJOBS, "scaled-rl-1")
        await eventually(lambda: _replicas(cluster, "scaled-sandbox", 3), what="lifted again on re-admission")
        await cluster.api.patch(DEPLOYMENTS, NS, "scaled-sandbox", {"spec": {"replicas": 6}})  # the HPA's
        await cluster.api.patch(RAYJOBS, NS, "scaled-rl-1", {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, subresource="status")
        await eventually(lambda: _replicas(cluster, "scaled-sandbox", 6), what="left to the HPA while rl runs")
        await cluster.finish(RAYJOBS, "scaled-rl-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}})
        await cluster.child(RAYJOBS, "scaled-eval-1")
        await kueue.admit(RAYJOBS, "scaled-eval-1")
        await cluster.finish(RAYJOBS, "scaled-eval-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}})
        await cluster.phase_is("scaled", "Succeeded")
        await eventually(lambda: _replicas(cluster, "scaled-sandbox", 0), what="zero once the run is over")


async def stage_state_is(cluster: Cluster, run: str, stage: str, state: str) -> None:
    async def probe() -> bool:
        entry = stage_of(await cluster.status(run), stage)
        return entry["state"] == state

    await eventually(probe, what=f"{run} {stage} {state}")


async def test_an_ascend_run_is_refused_on_a_kuberay_older_than_1_5(cluster: Cluster) -> None:
    from tests.operator.test_kuberay_crd import rayjob_crd

    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", **rayjob_crd(group_resources=False)}
    await cluster.api._request("POST", KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")].path(None), json=crd)  # cluster-scoped
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("npu", hardware={"accelerator": "ascend"}))
        status = await cluster.phase_is("npu", "Failed")
        assert "older than 1.5" in status["message"]
        assert await cluster.api.get(JOBS, NS, "npu-prepare-1") is None  # nothing started, no NPU held


async def test_a_kueue_without_workload_v1beta2_is_served_through_v1beta1(cluster: Cluster) -> None:
    """Kueue before 0.16 serves only v1beta1 Workloads; 0.16+ stores v1beta2 and deprecates v1beta1."""
    from tests.operator.kueue import FakeKueue
    from tests.operator.test_integration_cluster import stage_state

    del cluster.k8s.resources["kueue.x-k8s.io/v1beta2/workloads"]
    v1beta1 = KINDS[("kueue.x-k8s.io/v1beta1", "Workload")]
    kueue = FakeKueue(cluster.api, NS, v1beta1)
    async with running_operator(cluster.config):
        await cluster.api.create(spec_doc("older", scheduling={"queueName": "team-a"}))
        await cluster.child(JOBS, "older-prepare-1")
        await kueue.admit(JOBS, "older-prepare-1")
        await stage_state(cluster, "older", "prepare", "Running")
        await cluster.api.patch(RUNS, NS, "older", {"spec": {"suspend": True}})
        wl = await kueue.workload_of(JOBS, "older-prepare-1")

        async def deactivated() -> bool:
            current = await cluster.api.get(v1beta1, NS, wl["metadata"]["name"])
            return current is not None and current["spec"]["active"] is False

        await eventually(deactivated, what="the v1beta1 workload deactivated")


async def test_a_driver_failure_keeps_the_cluster_for_the_retry_and_spec_suspend_then_releases_it(cluster: Cluster) -> None:
    """KubeRay v1.6.1 as ``FakeKubeRay`` plays it: the failed RayJob (AppFailed, Ray's FAILED) would delete its
    cluster at its TTL; the operator keeps it first (shutdownAfterJobFinishes false), attempt 2 selects it and takes
    its pods over; spec.suspend then ends attempt 2 (KubeRay cannot suspend a clusterSelector RayJob): the operator
    deletes its RayJob and the cluster, and the resumed run's attempt 3 makes a cluster of its own."""
    async with running_operator(cluster.config):
        kuberay = await _to_sft(cluster, "again", failurePolicy={"maxRetries": 2, "backoffSeconds": 1})
        cluster_name = "again-sft-1-raycluster"
        await kuberay.end("again-sft-1", "Failed", "FAILED", reason="AppFailed", ttl_passed=False)

        async def kept() -> dict[str, Any] | None:
            rayjob = await cluster.api.get(RAYJOBS, NS, "again-sft-1")
            return rayjob if rayjob and rayjob["spec"]["shutdownAfterJobFinishes"] is False else None

        await eventually(kept, what="the failed RayJob patched to leave its cluster up")
        await kuberay.ttl_passes("again-sft-1")
        assert await cluster.api.get(RAYCLUSTERS, NS, cluster_name) is not None
        second = await cluster.child(RAYJOBS, "again-sft-2", timeout=15)
        assert second["spec"]["clusterSelector"] == {"ray.io/cluster": cluster_name} and "rayClusterSpec" not in second["spec"]
        head = await cluster.api.get(PODS, NS, "again-sft-1-head-x1")
        assert head is not None and head["metadata"]["labels"][c.LABEL_ATTEMPT] == "2" and head["metadata"]["annotations"]["retool.dev/attempt-since"]
        await kuberay.start("again-sft-2")
        await cluster.api.patch(RUNS, NS, "again", {"spec": {"suspend": True}})

        async def released() -> bool | None:
            rayjob = await cluster.api.get(RAYJOBS, NS, "again-sft-2")
            gone = rayjob is None or bool(rayjob["metadata"].get("deletionTimestamp"))
            return (gone and await cluster.api.get(RAYCLUSTERS, NS, cluster_name) is None) or None

        await eventually(released, what="attempt 2's RayJob and the kept cluster deleted")
        sft = stage_of(await cluster.status("again"), "sft")
        assert sft["state"] == "Retrying" and sft["preemptedAttempts"] == 1 and "cannot be suspended" in sft["message"]
        await kuberay.collect(cluster_name)
        await cluster.api.patch(RUNS, NS, "again", {"spec": {"suspend": False}})
        third = await cluster.child(RAYJOBS, "again-sft-3", timeout=20)
        assert "rayClusterSpec" in third["spec"] and "clusterSelector" not in third["spec"]
        await eventually(lambda: _forgot(cluster, "again"), what="the stage forgetting the deleted cluster")


async def _forgot(cluster: Cluster, name: str) -> bool | None:
    return "rayCluster" not in stage_of(await cluster.status(name), "sft") or None
