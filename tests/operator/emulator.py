"""The real operator (kopf, in this event loop) against kmock's KubernetesEmulator on 127.0.0.1.

The emulator serves the API groups the operator touches; the test talks to it over HTTP with the
operator's own client class (a different User-Agent), so it can tell the operator's requests apart
for the RBAC check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import aiohttp.web
import kmock
import kopf
import yaml

from retool_operator import handlers  # noqa: F401  (registers the handlers)
from retool_operator.config import OperatorConfig
from retool_operator.kube import KINDS, Credentials, KubeClient

T = TypeVar("T")

RESOURCES: dict[str, tuple[str, bool, set[str]]] = {
    "retool.dev/v1alpha1/retoolruns": ("RetoolRun", True, {"status"}),
    "apps/v1/deployments": ("Deployment", True, {"status", "scale"}),
    "v1/services": ("Service", True, set()),
    "v1/configmaps": ("ConfigMap", True, set()),
    "v1/secrets": ("Secret", True, set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/nodes": ("Node", False, {"status"}),
    "autoscaling/v2/horizontalpodautoscalers": ("HorizontalPodAutoscaler", True, {"status"}),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
    "batch/v1/jobs": ("Job", True, {"status"}),
    "ray.io/v1/rayjobs": ("RayJob", True, {"status"}),
    "ray.io/v1/rayclusters": ("RayCluster", True, {"status"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, {"status"}),
    "scheduling.k8s.io/v1/priorityclasses": ("PriorityClass", False, set()),
    "kueue.x-k8s.io/v1beta2/workloads": ("Workload", True, {"status"}),
    "kueue.x-k8s.io/v1beta1/workloads": ("Workload", True, {"status"}),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
TEST_AGENT = "retool-tests"

RUNS = KINDS[("retool.dev/v1alpha1", "RetoolRun")]
JOBS = KINDS[("batch/v1", "Job")]
RAYJOBS = KINDS[("ray.io/v1", "RayJob")]
DEPLOYMENTS = KINDS[("apps/v1", "Deployment")]


Refusal = Callable[[Any], "tuple[int, str] | tuple[int, str, dict[str, str]] | None"]
"""(HTTP status, message) or (status, message, response headers: a ``Retry-After``), or None to let the request through."""


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """A Kubernetes equality-based label selector (``a=b,c!=d,e,!f``) against ``labels``."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def fields_match(selector: str, obj: dict[str, Any]) -> bool:
    """A field selector of ``a.b=value`` terms (what the API server supports for Events' involvedObject.*)."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        path, _, value = term.partition("=")
        current: Any = obj
        for part in path.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if str(current or "") != value:
            return False
    return True


class ScalableEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator that stays fast with thousands of requests, and a little more like an API server.

    kmock routes each request by scanning every earlier request through each payload's filters
    (quadratic: 100 concurrent create/patch/get rounds take > 20 s). Here the scanned list holds
    only the requests in flight; every request is still kept, in ``history``, for assertions.

    Two things a real API server does that kmock does not: ``labelSelector`` filters lists and
    watches (server-side), and a request can be refused (``refusals``: a function of the request
    returning (HTTP status, message) or None) as quota, admission webhooks and policies do; a
    refused request changes nothing and is answered with a metav1.Status carrying the message.
    """

    refusals: list[Refusal]
    mutations: list[Callable[[Any], None]]
    """Mutating admission: each is called with every request before it is stored (may change ``request.data``)."""

    async def _handle(self, request: Any) -> Any:
        if not hasattr(self, "history"):
            self.history: list[Any] = []
            self.in_flight: list[Any] = []
        if not hasattr(self, "refusals"):
            self.refusals = []
        if request.resource is not None and request.action is not None and request.action.value == "CREATE" and isinstance(request.data, dict):
            # The API server gives every object a uid (Kueue finds a job's Workload by it).
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        for mutate in list(getattr(self, "mutations", [])):
            mutate(request)  # a mutating admission webhook (Kueue's defaulting, ...)
        self.history.append(request)
        for refusal in list(self.refusals):
            answer = refusal(request) if request.resource is not None else None
            if answer is not None:
                code, message, headers = (*answer, {}) if len(answer) == 2 else answer
                reason = {429: "TooManyRequests"}.get(code, "InternalError" if code >= 500 else "Forbidden")
                body = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
                return aiohttp.web.json_response(body, status=code, headers=headers)
        self.in_flight.append(request)
        self._requests[:] = self.in_flight
        try:
            return await super()._handle(request)
        finally:
            self.in_flight.remove(request)

    async def _serve_list(self, request: Any) -> Any:
        payload = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            payload["items"] = [o for o in payload["items"] if selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})]
        fields = request.params.get("fieldSelector")
        if fields:
            payload["items"] = [o for o in payload["items"] if fields_match(fields, o)]
        return payload

    async def _serve_watch(self, request: Any) -> Any:
        selector = request.params.get("labelSelector")
        async for event in super()._serve_watch(request):
            if selector and isinstance(event, dict):
                obj = event.get("object") or {}
                if not selector_matches(selector, (obj.get("metadata") or {}).get("labels") or {}):
                    continue
            yield event

    @property
    def requests(self) -> list[Any]:
        return list(getattr(self, "history", []))


def declare(k8s: kmock.KubernetesEmulator) -> None:
    for path, (kind, namespaced, subresources) in RESOURCES.items():
        k8s.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS, subresources=subresources)


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester", "namespace": "default"}}],
                "current-context": "emulator",
            }
        )
    )
    return path


class ObserverClient(KubeClient):
    """The test's own client: same code paths, but marked so its requests are not the operator's."""

    def __init__(self, creds: Credentials, **kwargs: Any):
        super().__init__(creds, timeout=10.0, **kwargs)

    def _new_api(self) -> Any:
        api = super()._new_api()
        api.user_agent = TEST_AGENT
        # No keep-alive: a pooled connection sometimes stalls on its first request after an
        # operator in the same loop stops (kmock's server side); a fresh one never does.
        pooled = api.rest_client.pool_manager
        api.rest_client.pool_manager = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        asyncio.get_running_loop().create_task(pooled.close())  # unused: no connection was opened on it
        return api


@contextlib.asynccontextmanager
async def running_operator(config: OperatorConfig) -> AsyncIterator[None]:
    """kopf.operator() as a task; stopped (and awaited) on exit, like a pod being replaced."""
    stop, ready = asyncio.Event(), asyncio.Event()
    memo = kopf.Memo(config=config)
    task = asyncio.create_task(kopf.operator(clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready, memo=memo))
    await asyncio.wait_for(ready.wait(), timeout=15)
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


async def eventually(probe: Callable[[], Awaitable[T | None]], *, timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def operator_requests(k8s: ScalableEmulator) -> list[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every resource request the operator made."""
    out = []
    for request in k8s.requests:
        agent = request.headers.get("User-Agent", "")
        if agent == TEST_AGENT or request.resource is None or request.resource.plural is None:
            continue  # the test's own calls, and discovery (granted to every authenticated user)
        action = request.action.value if request.action else ""
        verb = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "DELETE": "delete"}.get(action)
        if verb is None:
            verb = "update" if str(request.method.value).upper() == "PUT" else "patch"
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        out.append((request.resource.group or "", resource, verb))
    return out


def credentials_for(server: str) -> Credentials:
    return Credentials(server=server.rstrip("/"))
