"""The admission handler's one cluster read: a PriorityClass the run names but the cluster lacks is a warning.

Runs the real kopf handler function with the operator's own API client against the emulator (its
requests are recorded, and test_zz_rbac checks the chart grants exactly them). The API server's side
(kubectl printing the warning, the Priority admission plugin refusing the pods) is tests/e2e/test_admission.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import kopf

from retool_operator.cluster_warnings import PRIORITY_CLASSES, priority_class_warnings
from retool_operator.handlers import SharedState, validate_retoolrun
from retool_operator.kube import KubeClient
from tests.operator.emulator import JOBS, credentials_for, running_operator
from tests.operator.helpers import document
from tests.operator.test_integration import CONFIG, NS, Cluster, cluster, spec_doc  # noqa: F401  (the recording fixture)


def _run(priority_class: str | None) -> dict[str, Any]:
    doc = document(name="prio", namespace=NS, uid="uid-prio")
    if priority_class:
        doc["spec"].setdefault("scheduling", {})["priorityClassName"] = priority_class
    return doc


async def _validate(client: KubeClient, body: dict[str, Any]) -> list[str]:
    shared = SharedState()
    shared.reconciler = SimpleNamespace(client=client)  # the handler uses the reconciler's client only
    memo = kopf.Memo(config=CONFIG, shared=shared)
    warnings: list[str] = []
    await validate_retoolrun(body=body, old=None, operation="CREATE", warnings=warnings, memo=memo)
    return warnings


async def test_a_missing_priority_class_is_a_warning_naming_it_and_an_existing_one_is_not(cluster: Cluster) -> None:  # noqa: F811
    client = KubeClient(cluster.api._creds)  # the operator's client (its User-Agent): recorded as the operator's request
    try:
        async with running_operator(cluster.config):
            await cluster.api.create(spec_doc("prio"))
            await cluster.child(JOBS, "prio-prepare-1")  # the operator runs: its watches are up
            missing = [w for w in await _validate(client, _run("retool-high")) if "PriorityClass" in w]
            assert len(missing) == 1 and "'retool-high'" in missing[0] and "spec.scheduling.priorityClassName" in missing[0], missing
            await cluster.api.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "retool-high"}, "value": 1000})
            assert not [w for w in await _validate(client, _run("retool-high")) if "PriorityClass" in w]
            assert not [w for w in await _validate(client, _run(None)) if "PriorityClass" in w]
    finally:
        await client.close()


async def test_a_read_that_does_not_answer_costs_the_warning_not_the_admission() -> None:
    client = KubeClient(credentials_for("http://127.0.0.1:9"))  # nothing listens: the client retries until the bound
    started = time.monotonic()
    try:
        assert await priority_class_warnings(client, _run("retool-high"), timeout=0.5) == []
    finally:
        await client.close()
    assert time.monotonic() - started < 5, "the read is bounded: admission answers within the webhook's timeout"
    assert PRIORITY_CLASSES.path("", "retool-high") == "/apis/scheduling.k8s.io/v1/priorityclasses/retool-high"  # cluster-scoped
