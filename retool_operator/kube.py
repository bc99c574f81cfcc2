"""The operator's Kubernetes API calls: get, list, create, merge-patch, ensure, on kubernetes_asyncio.

kopf keeps its own client private; this one reuses the credentials kopf logged in with (see
``handlers.login``), so the operator authenticates once, the same way, in-cluster or with a
kubeconfig. HTTP, TLS and the bearer header are kubernetes_asyncio's ``ApiClient`` (the maintained
client, on the aiohttp kopf already uses); what stays here is what that client does not do for us:
paths for the kinds we own, a token re-read when the kubelet rotates it (and once on a 401), the
API server's refusal text, bounded back-off on throttling and server errors (``Backoff``), and the
apply cache. What to send is decided by the pure modules.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import random
import re
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from retool.retry_after import parse_retry_after

log = logging.getLogger(__name__)

USER_AGENT = "retool-operator"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "ConfigMap"): Kind("", "v1", "configmaps"),
    ("v1", "Service"): Kind("", "v1", "services"),
    ("v1", "PersistentVolumeClaim"): Kind("", "v1", "persistentvolumeclaims"),
    ("v1", "Pod"): Kind("", "v1", "pods"),
    ("v1", "Node"): Kind("", "v1", "nodes"),
    ("v1", "Event"): Kind("", "v1", "events"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): Kind("autoscaling", "v2", "horizontalpodautoscalers"),
    ("apps/v1", "Deployment"): Kind("apps", "v1", "deployments"),
    ("networking.k8s.io/v1", "NetworkPolicy"): Kind("networking.k8s.io", "v1", "networkpolicies"),
    ("policy/v1", "PodDisruptionBudget"): Kind("policy", "v1", "poddisruptionbudgets"),
    ("batch/v1", "Job"): Kind("batch", "v1", "jobs"),
    ("ray.io/v1", "RayJob"): Kind("ray.io", "v1", "rayjobs"),
    ("ray.io/v1", "RayCluster"): Kind("ray.io", "v1", "rayclusters"),
    # v1beta2: Kueue's storage version since 0.16 (v1beta1 deprecated there, still served); v1beta1 for older Kueue.
    ("kueue.x-k8s.io/v1beta2", "Workload"): Kind("kueue.x-k8s.io", "v1beta2", "workloads"),
    ("kueue.x-k8s.io/v1beta1", "Workload"): Kind("kueue.x-k8s.io", "v1beta1", "workloads"),
    ("retool.dev/v1alpha1", "RetoolRun"): Kind("retool.dev", "v1alpha1", "retoolruns"),
    ("scheduling.k8s.io/v1", "PriorityClass"): Kind("scheduling.k8s.io", "v1", "priorityclasses"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
}


def kind_of(obj: dict[str, Any]) -> Kind:
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key not in KINDS:
        raise ValueError(f"no API mapping for {key[0]} {key[1]}")
    return KINDS[key]


RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers that say "not now" rather than "no": 429 from API Priority and Fairness or the max-in-flight
filter (both send ``Retry-After``), 500 while etcd elects a leader or times out, 502-504 from a load
balancer in front of a restarting API server, 503 while it starts (``/readyz`` not yet ok)."""


class ApiError(Exception):
    """A non-2xx answer; ``reason`` is the API server's own message (Status.message) when it sent one.

    ``retry_after``: the seconds its ``Retry-After`` header asked for, when it sent one."""

    def __init__(self, status: int, message: str, reason: str | None = None, retry_after: float | None = None):
        self.status = status
        self.reason = reason or message
        self.retry_after = retry_after
        super().__init__(f"HTTP {status}: {message}")

    @property
    def transient(self) -> bool:
        """Throttled or a server error: the same request may succeed later unchanged (never a refusal)."""
        return self.status in RETRYABLE_STATUSES

    @property
    def refused(self) -> bool:
        """The API server (or an admission webhook, a quota, a policy) said no to this request.

        4xx other than 429 (throttling): retrying the same request gives the same answer until
        something changes, so it is reported on the run, not just retried.
        """
        return 400 <= self.status < 500 and self.status != 429


def _status_message(text: str) -> str | None:
    """The ``message`` of a metav1.Status body (what kubectl prints), else None."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    message = body.get("message") if isinstance(body, dict) else None
    return str(message)[:1000] if message else None


@dataclass(frozen=True)
class Backoff:
    """How one request waits out throttling (429) and server errors (5xx) before its caller sees them.

    Try ``attempts`` times in all; wait before try n+1 with full jitter in [0, min(cap, base * 2**n)]
    (many passes throttled together do not come back together), never less than the server's
    ``Retry-After`` (it knows its queue) and never more than ``cap``; stop once the waits would pass
    ``budget`` seconds, so a pass never hangs on an unwell server: the error then goes up as
    ``ApiError.transient`` and the reconciler requeues the pass (``Reconciler._pass_loop``), it is
    never shown on the run as a refusal. Connection failures (a restarting API server) are retried
    the same way: a create that reached the server before the connection dropped answers 409 on
    the retry, which ``KubeClient.create`` takes as "already there".
    """

    attempts: int = 6
    base: float = 0.25
    cap: float = 8.0
    budget: float = 20.0

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        wait = rng.uniform(0, min(self.cap, self.base * 2**retry))
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.cap)


QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit", "capacity"})
"""Fields whose values are resource quantities, which the API server stores in canonical form."""
_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def quantity(value: Any) -> Decimal | None:
    """The value of a Kubernetes resource quantity (``1000m``, ``20480Mi``, ``8``), None when it is not one
    (the grammar of k8s.io/apimachinery/pkg/api/resource, v0.36.1)."""
    match = _QUANTITY.match(str(value).strip()) if isinstance(value, str | int | float) and not isinstance(value, bool) else None
    if match is None:
        return None
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]


def is_subset(desired: Any, observed: Any, *, quantities: bool = False) -> bool:
    """Whether every field of ``desired`` is already in ``observed`` (server defaults are extra fields).

    Inside ``resources.requests``/``limits``, ``sizeLimit`` and ``capacity`` values are compared as
    quantities: the API server returns ``1000m`` as ``1`` and ``20480Mi`` as ``20Gi``, and comparing the
    strings would patch the same object on every pass.
    """
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(k in observed and is_subset(v, observed[k], quantities=quantities or k in QUANTITY_KEYS) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(observed, list) and len(desired) == len(observed) and all(is_subset(d, o, quantities=quantities) for d, o in zip(desired, observed, strict=True))
    if quantities and desired != observed:
        want, have = quantity(desired), quantity(observed)
        return want is not None and want == have
    return desired == observed


@dataclass
class Credentials:
    server: str
    token: str | None = None
    scheme: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    token_path: str | None = None
    """A projected service-account token file: re-read whenever it changes (see ``KubeClient``)."""
    proxy: str | None = None
    trust_env: bool = False
    """kopf's networking settings (``settings.networking``), so both clients reach the server the same way."""


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def token_file_for(token: str | None, path: str = SERVICE_ACCOUNT_TOKEN) -> str | None:
    """``path`` when ``token`` came from it (kopf's in-cluster login read it once), else None."""
    if not token or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return path if handle.read().strip() == token else None
    except OSError:
        return None


def pem_file(data: bytes) -> str:
    """PEM (or base64 of PEM, as kubeconfigs carry it) in a private file: ssl loads files only."""
    raw = data if b"-----BEGIN" in data else base64.b64decode(data)
    handle = tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False)  # noqa: SIM115 - lives as long as the process
    handle.write(raw)
    handle.close()
    return handle.name


def credentials_from(info: Any) -> Credentials:
    """From kopf's ConnectionInfo (CA, certificate and key data are written to private temporary files for ssl)."""

    def as_file(path: Any, data: Any) -> str | None:
        if path:
            return str(path)
        return pem_file(data if isinstance(data, bytes) else data.encode()) if data else None

    return Credentials(
        server=info.server.rstrip("/"),
        token=info.token,
        scheme=info.scheme,
        ca_path=as_file(info.ca_path, info.ca_data),
        insecure=bool(info.insecure),
        cert_path=as_file(info.certificate_path, info.certificate_data),
        key_path=as_file(info.private_key_path, info.private_key_data),
        token_path=token_file_for(info.token),
        proxy=info.proxy_url,
        trust_env=bool(info.trust_env),
    )


class TokenSource:
    """The bearer token, re-read from ``creds.token_path`` when the file changed (or when forced).

    The kubelet rotates a projected service-account token (about hourly) and clusters that do not
    extend token lifetimes reject the old one soon after; a token read once at login would lock the
    operator out. kubernetes_asyncio's own in-cluster hook trusts a token read less than a minute
    ago (``TOKEN_REFRESH_PERIOD``), which is a minute of 401s after a revocation; this one costs a
    stat per request and follows the file at once.
    """

    def __init__(self, creds: Credentials):
        self._creds = creds
        self._stamp: int | None = None

    def current(self, *, force: bool = False) -> str | None:
        path = self._creds.token_path
        if path:
            try:
                stamp = os.stat(path).st_mtime_ns
                if force or stamp != self._stamp:
                    with open(path, encoding="utf-8") as handle:
                        self._creds.token = handle.read().strip() or self._creds.token
                    self._stamp = stamp
            except OSError as err:
                log.warning("cannot re-read the service-account token %s: %s", path, err)
        return self._creds.token

    def refresh(self, config: Configuration) -> None:
        """kubernetes_asyncio's ``refresh_api_key_hook``: called before every request's auth header."""
        token = self.current()
        if token:
            config.api_key["BearerToken"] = token


def configuration_for(creds: Credentials, tokens: TokenSource, *, concurrency: int) -> Configuration:
    """kubernetes_asyncio's Configuration for kopf's login: server, TLS, bearer token and its refresh."""
    config = Configuration(host=creds.server)
    config.verify_ssl = not creds.insecure
    config.ssl_ca_cert = creds.ca_path
    config.cert_file, config.key_file = creds.cert_path, creds.key_path
    config.connection_pool_maxsize = concurrency
    config.proxy = creds.proxy
    token = tokens.current()
    if token:
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": creds.scheme or "Bearer"}
        config.refresh_api_key_hook = tokens.refresh
    return config


_JSON_BODY = {200: "object", 201: "object"}
"""Answers kept as plain JSON (``object``): no model classes for custom resources, no extra copies."""


class JsonApiClient(ApiClient):
    """kubernetes_asyncio's ApiClient for a caller whose bodies are JSON already, on kopf's networking.

    Two costs of the stock client that this operator never needs, measured per request against a
    loopback server (``bench/RESULTS.md``, "The API client swap"): ``sanitize_for_serialization``
    walks every key of every body to convert model objects and dates (our builders produce plain
    dicts; 0.13 ms per Deployment patch), and its aiohttp session is opened with ``trust_env=True``,
    which sends each request through two thread-pool hops (``~/.netrc`` and proxy lookups). The
    session here keeps the library's connector (its TLS context, client certificate and pool size)
    and follows kopf's ``trust_env`` (off unless the operator's settings turn it on), as kopf's own
    client does.
    """

    def __init__(self, configuration: Configuration, *, trust_env: bool = False):
        super().__init__(configuration)
        stock = self.rest_client.pool_manager
        connector = stock.connector
        stock.detach()  # the connector moves to the new session; nothing was opened on the old one
        self.rest_client.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=trust_env, read_bufsize=2**21)

    def sanitize_for_serialization(self, obj: Any) -> Any:
        return obj


class KubeClient:
    """One kubernetes_asyncio ApiClient for the operator's lifetime; bounded concurrency to spare the API server."""

    def __init__(
        self, creds: Credentials, *, concurrency: int = 32, timeout: float = 30.0, verify_seconds: float = 300.0, backoff: Backoff | None = None
    ):
        self._creds = creds
        self.backoff = backoff or Backoff()
        self.retries = 0
        """Requests sent again after a 429, a 5xx or a dropped connection (for logs and benchmarks)."""
        self._sleep = asyncio.sleep
        self._rng = random.Random()
        self._applied: dict[tuple[str, str, str], tuple[str, float]] = {}
        self.verify_seconds = verify_seconds
        self._concurrency = concurrency
        self._api: ApiClient | None = None
        self._limit = asyncio.Semaphore(concurrency)
        self._timeout = timeout
        self._tokens = TokenSource(creds)

    def _new_api(self) -> ApiClient:
        """Created inside the running loop (its aiohttp session binds to it)."""
        api = JsonApiClient(configuration_for(self._creds, self._tokens, concurrency=self._concurrency), trust_env=self._creds.trust_env)
        api.user_agent = USER_AGENT
        return api

    def _get_api(self) -> ApiClient:
        if self._api is None or self._api.rest_client.pool_manager.closed:
            self._api = self._new_api()
        return self._api

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()

    async def _request(self, method: str, path: str, *, json: Any = None, content_type: str = "application/json", query: list[tuple[str, str]] | None = None) -> Any:
        """One API call; 401 re-reads the token once, 429/5xx and dropped connections back off (``Backoff``)."""
        waited, retry = 0.0, 0
        while True:
            try:
                return await self._call(method, path, json=json, content_type=content_type, query=query)
            except (ApiError, aiohttp.ClientConnectionError) as err:
                if isinstance(err, ApiError) and not err.transient:
                    raise
                retry_after = err.retry_after if isinstance(err, ApiError) else None
                delay = self.backoff.delay(retry, retry_after, self._rng)
                if retry + 1 >= self.backoff.attempts or waited + delay > self.backoff.budget:
                    raise
                what = f"HTTP {err.status}" if isinstance(err, ApiError) else type(err).__name__
                log.warning("%s %s: %s; trying again in %.2f s (retry %d of %d)", method, path, what, delay, retry + 1, self.backoff.attempts - 1)
                self.retries += 1
                retry += 1
                waited += delay
                await self._sleep(delay)  # outside the concurrency limit: a throttled call holds no slot

    async def _call(self, method: str, path: str, *, json: Any, content_type: str, query: list[tuple[str, str]] | None) -> Any:
        api = self._get_api()
        for attempt in (1, 2):
            if attempt == 2:
                self._tokens.current(force=True)  # the token was rotated under us: read it again, once
            headers = {"Accept": "application/json", "Content-Type": content_type}
            try:
                async with self._limit:
                    return await api.call_api(
                        path, method, query_params=query, header_params=headers, body=json, auth_settings=["BearerToken"],
                        response_types_map=_JSON_BODY, _return_http_data_only=True, _request_timeout=self._timeout,
                    )  # fmt: skip
            except ApiException as err:
                if err.status == 401 and attempt == 1 and self._creds.token_path:
                    continue
                text = err.body if isinstance(err.body, str) else (err.body or b"").decode("utf-8", "replace")
                retry_after = parse_retry_after((err.headers or {}).get("Retry-After"))
                raise ApiError(err.status, f"{method} {path}: {text[:300]}", reason=_status_message(text), retry_after=retry_after) from None
        raise AssertionError("unreachable")

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", kind.path(namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def list(self, kind: Kind, namespace: str, *, label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        query = [(key, value) for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if value]
        data = await self._request("GET", kind.path(namespace), query=query or None)
        return list(data.get("items") or [])

    async def create(self, obj: dict[str, Any]) -> bool:
        """POST; False when it already exists (409): deterministic names make creation idempotent."""
        kind = kind_of(obj)
        try:
            await self._request("POST", kind.path(obj["metadata"].get("namespace")), json=obj)
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        """DELETE (the API server's default, background propagation: the garbage collector removes what it owns); False when it is gone already (404)."""
        try:
            await self._request("DELETE", kind.path(namespace, name))
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        return await self._request("PATCH", kind.path(namespace, name, subresource), json=patch, content_type="application/merge-patch+json")

    async def ensure(self, obj: dict[str, Any]) -> str:
        """Create-or-patch: 'created', 'patched', 'unchanged' or 'cached'.

        POST first (one request for a new object; 409 means it exists), then compare and patch
        only what differs. An object applied with the same content less than ``verify_seconds``
        ago is not fetched again ('cached'), so steady-state passes cost no requests; after that
        it is re-read, which also repairs children edited or deleted behind the operator's back.
        """
        kind = kind_of(obj)
        meta = obj["metadata"]
        key = (kind.plural, meta["namespace"], meta["name"])
        digest = hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()
        seen = self._applied.get(key)
        if seen is not None and seen[0] == digest and time.monotonic() - seen[1] < self.verify_seconds:
            return "cached"
        result = "created"
        if not await self.create(obj):
            current = await self.get(kind, meta["namespace"], meta["name"]) or {}
            desired = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
            result = "unchanged"
            if not is_subset(desired, current):
                await self.patch(kind, meta["namespace"], meta["name"], desired)
                result = "patched"
        self._applied[key] = (digest, time.monotonic())
        return result

    def forget(self, namespace: str, names: set[str]) -> None:
        """Drop cached applications of a deleted run's children."""
        for key in [k for k in self._applied if k[1] == namespace and k[2] in names]:
            del self._applied[key]
