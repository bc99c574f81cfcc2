"""The operator's API client on kubernetes_asyncio: what it takes from kopf's login, how it reaches
the server, and what a refusal looks like to its callers. Against kmock's emulator (a real HTTP
server on loopback); the TLS path is exercised by every tests/e2e scenario (the real API server)."""

from __future__ import annotations

import base64
import random
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest

from retool_operator.kube import KINDS, ApiError, Backoff, Credentials, KubeClient, TokenSource, configuration_for, credentials_from, parse_retry_after
from tests.conftest import free_port
from tests.operator.emulator import ScalableEmulator, declare

CONFIGMAPS = KINDS[("v1", "ConfigMap")]
PEM = b"-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("ca_data", [PEM, base64.b64encode(PEM)], ids=["pem", "base64-as-in-a-kubeconfig"])
def test_kopfs_login_becomes_the_clients_configuration(ca_data: bytes) -> None:
    info = kopf.ConnectionInfo(server="https://10.0.0.1:6443/", ca_data=ca_data, scheme="Bearer", token="tok", proxy_url="http://proxy:3128", trust_env=True)
    creds = credentials_from(info)
    assert (creds.server, creds.proxy, creds.trust_env) == ("https://10.0.0.1:6443", "http://proxy:3128", True)
    config = configuration_for(creds, TokenSource(creds), concurrency=7)
    assert Path(config.ssl_ca_cert).read_bytes() == PEM  # ssl loads CA files only: the data went to a private file
    assert (config.host, config.proxy, config.verify_ssl, config.connection_pool_maxsize) == ("https://10.0.0.1:6443", "http://proxy:3128", True, 7)
    assert (config.api_key, config.api_key_prefix) == ({"BearerToken": "tok"}, {"BearerToken": "Bearer"})


def test_an_insecure_login_skips_verification_and_no_token_sends_no_header() -> None:
    creds = credentials_from(kopf.ConnectionInfo(server="https://10.0.0.1:6443", insecure=True))
    config = configuration_for(creds, TokenSource(creds), concurrency=1)
    assert config.verify_ssl is False and config.api_key == {} and config.refresh_api_key_hook is None


async def test_a_refusal_reaches_the_caller_with_the_api_servers_status_and_message() -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        k8s.refusals = [lambda request: (403, 'configmaps "c" is forbidden: exceeded quota: q') if request.method.value == "POST" else None]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"))
        try:
            with pytest.raises(ApiError) as refused:
                await client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}, "data": {}})
            assert (refused.value.status, refused.value.refused) == (403, True)
            assert refused.value.reason == 'configmaps "c" is forbidden: exceeded quota: q'
            assert await client.get(CONFIGMAPS, "ml", "c") is None  # a 404 is an answer, not an error
        finally:
            await client.close()


async def test_labels_and_fields_select_on_the_server() -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"))
        try:
            for name, role in (("a", "x y"), ("b", "z")):
                assert await client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ml", "labels": {"role": role.replace(" ", "-")}}})
            found = await client.list(CONFIGMAPS, "ml", label_selector="role=x-y", field_selector="metadata.name=a")
            assert [o["metadata"]["name"] for o in found] == ["a"]
        finally:
            await client.close()


@pytest.mark.parametrize("trust_env", [False, True], ids=["kopf-default-direct", "trust-env-uses-the-proxy"])
async def test_proxy_variables_apply_only_when_kopf_trusts_the_environment(monkeypatch: pytest.MonkeyPatch, trust_env: bool) -> None:
    """kubernetes_asyncio opens its session with trust_env=True; the operator follows kopf's setting
    (off by default), so a proxy variable meant for other traffic cannot reroute the API calls."""
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t", trust_env=trust_env))
        try:
            outcome: Any
            try:
                outcome = await client.get(CONFIGMAPS, "ml", "absent")
            except aiohttp.ClientError as err:
                outcome = err
            if trust_env:
                assert isinstance(outcome, aiohttp.ClientProxyConnectionError)
            else:
                assert outcome is None
        finally:
            await client.close()


# ---------------------------------------------------------------- throttling and server errors


def _throttle(count: int, *, code: int = 429, retry_after: str | None = "1") -> tuple[Any, list[int]]:
    """A refusal answering the first ``count`` ConfigMap creates with ``code`` (APF's 429 carries
    ``Retry-After: 1``), then letting them through; the list counts the answers given."""
    given: list[int] = []

    def refuse(request: Any) -> Any:
        if request.resource.plural != "configmaps" or request.method.value != "POST" or len(given) >= count:
            return None
        given.append(code)
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return code, "the server has received too many requests and has asked us to try again later", headers

    return refuse, given


CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}, "data": {}}


@pytest.mark.parametrize(("code", "retry_after"), [(429, "1"), (503, None), (500, "2")], ids=["throttled-429", "unavailable-503", "etcd-error-500"])
async def test_throttling_and_server_errors_are_waited_out_honouring_retry_after(code: int, retry_after: str | None) -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        refuse, given = _throttle(3, code=code, retry_after=retry_after)
        k8s.refusals = [refuse]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"))
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        client._sleep = sleep
        try:
            assert await client.create(CONFIGMAP) is True  # the fourth try is let through
            assert given == [code] * 3 and client.retries == 3 and len(waits) == 3
            floor = float(retry_after or 0)
            assert all(floor <= wait <= client.backoff.cap for wait in waits), waits
            assert await client.get(CONFIGMAPS, "ml", "c") is not None
        finally:
            await client.close()


async def test_throttling_that_outlasts_the_back_off_is_transient_never_a_refusal() -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        refuse, given = _throttle(100, retry_after="1")
        k8s.refusals = [refuse]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"), backoff=Backoff(attempts=4, budget=60))
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        client._sleep = sleep
        try:
            with pytest.raises(ApiError) as throttled:
                await client.create(CONFIGMAP)
            err = throttled.value
            assert (err.status, err.transient, err.refused, err.retry_after) == (429, True, False, 1.0)
            assert len(given) == 4 and len(waits) == 3  # bounded: four tries in all
        finally:
            await client.close()


def test_the_back_off_budget_bounds_the_total_wait() -> None:
    """Waits stop before their sum passes the budget, whatever the server's Retry-After asks."""
    backoff = Backoff(attempts=100, base=1, cap=8, budget=20)
    rng = random.Random(7)
    waits = [backoff.delay(n, 30, rng) for n in range(5)]
    assert waits == [8, 8, 8, 8, 8]  # a Retry-After over the cap waits the cap
    assert [backoff.delay(n, None, random.Random(n)) <= min(8, 2**n) for n in range(10)] == [True] * 10


@pytest.mark.parametrize(("value", "seconds"), [("1", 1.0), ("0", 0.0), ("2.5", 2.5), (None, None), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("-3", None)])
def test_retry_after_is_read_in_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


async def test_a_refusal_is_not_retried() -> None:
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        refuse, given = _throttle(5, code=403, retry_after=None)
        k8s.refusals = [refuse]
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"))
        try:
            with pytest.raises(ApiError) as refused:
                await client.create(CONFIGMAP)
            assert (refused.value.refused, refused.value.transient, len(given), client.retries) == (True, False, 1, 0)
        finally:
            await client.close()


# ---------------------------------------------------------------- the apply cache


async def test_the_apply_cache_is_keyed_by_content_and_re_reads_after_verify_seconds() -> None:
    """``ensure`` skips an object applied with the same content less than ``verify_seconds`` ago (no
    request at all); different content is applied at once, and after ``verify_seconds`` the object is
    read again, which repairs an edit made behind the operator's back."""
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        client = KubeClient(Credentials(server=str(server.url).rstrip("/"), token="t"), verify_seconds=3600)
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}, "data": {"k": "1"}}
        try:
            assert await client.ensure(obj) == "created"
            sent = len(k8s.requests)
            assert await client.ensure({**obj, "metadata": dict(obj["metadata"])}) == "cached"  # an equal copy: same key
            assert len(k8s.requests) == sent
            assert await client.ensure({**obj, "data": {"k": "2"}}) == "patched"  # new content is never taken from the cache
            assert (await client.get(CONFIGMAPS, "ml", "c"))["data"] == {"k": "2"}
            await client.patch(CONFIGMAPS, "ml", "c", {"data": {"k": "edited"}})  # behind the operator's back
            assert await client.ensure({**obj, "data": {"k": "2"}}) == "cached"  # within verify_seconds: trusted
            client.verify_seconds = 0
            assert await client.ensure({**obj, "data": {"k": "2"}}) == "patched"  # verified: the edit is repaired
            assert (await client.get(CONFIGMAPS, "ml", "c"))["data"] == {"k": "2"}
            client.forget("ml", {"c"})
            client.verify_seconds = 3600
            assert await client.ensure({**obj, "data": {"k": "2"}}) == "unchanged"  # forgotten: read again, nothing to do
        finally:
            await client.close()
