"""The operator's API client on kubernetes_asyncio: what it takes from kopf's login, how it reaches
the server, and what a refusal looks like to its callers. Against kmock's emulator (a real HTTP
server on loopback); the TLS path is exercised by every tests/e2e scenario (the real API server)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from retool_operator.kube import KINDS, ApiError, Credentials, KubeClient, TokenSource, configuration_for, credentials_from

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
