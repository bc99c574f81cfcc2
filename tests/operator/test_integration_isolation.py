# ruff: noqa: F811  (the tests take test_integration's `cluster` fixture, imported below)
"""The real operator reads real sandbox servers' /readyz and shows their isolation in the run's status.

Two sandbox servers run on 127.0.0.1, started as the embedded servers are (``python -m
retool.sandbox``): one with every layer this machine allows, one with seccomp, Landlock and
namespaces turned off (weak by construction). The test plays the Deployment controller and the
kubelet: it gives the sandbox Deployment replicas and creates its pods, running, with
``podIP: 127.0.0.1`` and the servers' ports as their declared container ports, which is exactly
where the operator connects on a cluster (pod IP, declared port). Every API request the operator
makes is checked against ``permissions.RULES`` by the ``cluster`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from retool.embedded.servers import sandbox_server
from retool_operator.kube import KINDS
from tests.operator.emulator import DEPLOYMENTS, JOBS, eventually, running_operator
from tests.operator.helpers import job_status
from tests.operator.test_integration import NS, Cluster, cluster, spec_doc  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
PODS = KINDS[("v1", "Pod")]
NETWORK_POLICIES = KINDS[("networking.k8s.io/v1", "NetworkPolicy")]
WEAK_ENV = {"RETOOL_SANDBOX_NAMESPACES": "off", "RETOOL_SANDBOX_SECCOMP": "false", "RETOOL_SANDBOX_LANDLOCK_MAX_ABI": "0"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"strong": url, "weak": url} of two real sandbox servers on 127.0.0.1."""
    with (
        sandbox_server(tmp_path_factory.mktemp("strong"), workers=1) as strong,
        sandbox_server(tmp_path_factory.mktemp("weak"), workers=1, env=WEAK_ENV) as weak,
    ):
        yield {"strong": strong.base_url, "weak": weak.base_url}


def readyz(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/readyz", timeout=10).json()["isolation"]


def sandbox_pod(run: str, name: str, url: str) -> dict[str, Any]:
    """A sandbox pod as the Deployment controller would create it, listening where ``url`` does."""
    port = int(url.rsplit(":", 1)[1])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"retool.dev/run": run, "retool.dev/component": "sandbox"}},
        "spec": {"containers": [{"name": "sandbox", "image": "retool/sandbox:test", "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
    }


POD_RUNNING = {"status": {"phase": "Running", "podIP": "127.0.0.1", "containerStatuses": [{"name": "sandbox", "state": {"running": {}}, "restartCount": 0}]}}


async def test_the_runs_status_shows_what_each_sandbox_replica_reports(cluster: Cluster, servers: dict[str, str]) -> None:
    config = cluster.config.model_copy(update={"own_namespace": "retool-system", "own_pod_selector": "app.kubernetes.io/name=retool,app.kubernetes.io/component=operator"})
    strong, weak = readyz(servers["strong"]), readyz(servers["weak"])
    assert weak["strong"] is False  # seccomp, Landlock and namespaces off: nothing guards the network
    async with running_operator(config):
        await cluster.api.create(spec_doc("iso", sandbox={"isolation": "strict"}))
        await cluster.child(JOBS, "iso-prepare-1")
        deployment = await cluster.child(DEPLOYMENTS, "iso-sandbox")
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RETOOL_SANDBOX_REQUIRE_ISOLATION"] == "true"
        policy = await cluster.child(NETWORK_POLICIES, "iso-sandbox")
        assert policy["spec"]["ingress"][-1]["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "retool-system"}}
        status = await cluster.status("iso")
        before = {c["type"]: c for c in status["conditions"]}["SandboxIsolation"]
        assert (before["status"], before["reason"]) == ("Unknown", "NotObserved")

        # One replica up, serving the strong server.
        await cluster.api.patch(DEPLOYMENTS, NS, "iso-sandbox", {"status": {"replicas": 1, "readyReplicas": 1}}, subresource="status")
        await cluster.api.create(sandbox_pod("iso", "iso-sandbox-a", servers["strong"]))
        await cluster.api.patch(PODS, NS, "iso-sandbox-a", POD_RUNNING, subresource="status")
        await cluster.api.patch(JOBS, NS, "iso-prepare-1", job_status(None), subresource="status")  # an event: one more pass

        async def observed(replicas: int) -> dict[str, Any] | None:
            isolation = ((await cluster.status("iso")).get("sandbox") or {}).get("isolation") or {}
            return isolation if isolation.get("replicas") == replicas else None

        isolation = await eventually(lambda: observed(1), what="status.sandbox.isolation from one replica")
        assert isolation["strong"] is strong["strong"]
        assert isolation["layers"] == strong["layers"] and isolation["mode"] == strong["mode"]
        cond = {c["type"]: c for c in (await cluster.status("iso"))["conditions"]}["SandboxIsolation"]
        # This test process may be root of the machine's own user namespace: the replica then says so too.
        assert cond["status"] == ("True" if strong["strong"] and not strong["root_on_node"] else "False")
        assert isolation.get("rootOnNode", []) == (["iso-sandbox-a"] if strong["root_on_node"] else [])

        # A second replica that is weak: the condition names it and what it lacks.
        await cluster.api.patch(DEPLOYMENTS, NS, "iso-sandbox", {"status": {"replicas": 2, "readyReplicas": 1}}, subresource="status")
        await cluster.api.create(sandbox_pod("iso", "iso-sandbox-b", servers["weak"]))
        await cluster.api.patch(PODS, NS, "iso-sandbox-b", POD_RUNNING, subresource="status")
        await cluster.api.patch(JOBS, NS, "iso-prepare-1", {"status": {"active": 1, "ready": 1}}, subresource="status")
        isolation = await eventually(lambda: observed(2), what="status.sandbox.isolation from two replicas")
        assert isolation["strong"] is False and isolation["weakReplicas"] == ["iso-sandbox-b"]
        assert "seccomp turned off by configuration (RETOOL_SANDBOX_SECCOMP=false)" in isolation["problems"]
        assert set(isolation["layers"]) == set(strong["layers"]) & set(weak["layers"])
        cond = {c["type"]: c for c in (await cluster.status("iso"))["conditions"]}["SandboxIsolation"]
        assert (cond["status"], cond["reason"]) == ("False", "WeakIsolation")
        assert "iso-sandbox-b" in cond["message"] and "RETOOL_SANDBOX_SECCOMP=false" in cond["message"]
