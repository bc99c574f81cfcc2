"""``python -m retool_operator`` with the webhook enabled: a real AdmissionReview over HTTPS to
/validate-retoolrun, and the liveness endpoint, on 127.0.0.1 (the API is kmock's emulator)."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest

from tests.conftest import free_port, repo_env
from tests.operator.emulator import ScalableEmulator, declare, write_kubeconfig
from tests.operator.helpers import document

pytestmark = pytest.mark.slow


def self_signed(directory: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt")],
        check=True, capture_output=True,
    )


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    certs = tmp_path / "webhook"
    certs.mkdir()
    self_signed(certs)
    port, liveness = free_port(), free_port()
    async with ScalableEmulator() as k8s, kmock.Server(k8s) as server:
        declare(k8s)
        env = repo_env(
            KUBECONFIG=str(write_kubeconfig(tmp_path / "kubeconfig", str(server.url))),
            RETOOL_OPERATOR_WEBHOOK_ENABLED="true",
            RETOOL_OPERATOR_WEBHOOK_PORT=str(port),
            RETOOL_OPERATOR_WEBHOOK_CERT_DIR=str(certs),
            RETOOL_OPERATOR_LIVENESS_PORT=str(liveness),
            RETOOL_OPERATOR_BIND_ADDRESS="127.0.0.1",
            RETOOL_OPERATOR_NAMESPACES="ml",
            RETOOL_OPERATOR_MLFLOW_PARENT_RUNS="false",
        )
        log = tmp_path / "operator.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "retool_operator"], env=env, stdout=out, stderr=subprocess.STDOUT)
        url, health = f"https://127.0.0.1:{port}/validate-retoolrun", f"http://127.0.0.1:{liveness}/healthz"
        try:
            deadline = time.monotonic() + 60
            async with httpx.AsyncClient(verify=False) as client:
                while True:
                    assert proc.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, "webhook did not start: " + log.read_text()[-3000:]
                    try:
                        await client.post(url, json={})
                        break
                    except httpx.TransportError:
                        time.sleep(0.2)
            yield url, health
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def review(operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "retool.dev", "version": "v1alpha1", "kind": "RetoolRun"},
            "resource": {"group": "retool.dev", "version": "v1alpha1", "resource": "retoolruns"},
            "requestKind": {"group": "retool.dev", "version": "v1alpha1", "kind": "RetoolRun"},
            "requestResource": {"group": "retool.dev", "version": "v1alpha1", "resource": "retoolruns"},
            "name": "demo",
            "namespace": "ml",
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {},
        },
    }


async def test_admission_reviews_over_https_and_liveness(webhook: tuple[str, str]) -> None:
    url, health = webhook
    good = document(namespace="ml")
    bad = copy.deepcopy(good)
    bad["spec"]["rl"] = {"stepz": 3}
    crossed = copy.deepcopy(good)
    crossed["spec"]["rl"] = {"miniBatchSize": 1000}
    running_rl = copy.deepcopy(good)
    running_rl["status"] = {"stages": [{"name": "rl", "state": "Running", "attempt": 1}]}
    edited = copy.deepcopy(good)
    edited["spec"]["rl"] = {"steps": 10}
    async with httpx.AsyncClient(verify=False, timeout=30) as client:
        allowed = (await client.post(url, json=review("CREATE", good))).json()["response"]
        assert allowed["allowed"] is True and allowed["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
        refused = (await client.post(url, json=review("CREATE", bad))).json()["response"]
        assert refused["allowed"] is False
        assert refused["status"]["code"] == 422
        assert "spec.rl.stepz: unknown field" in refused["status"]["message"]
        crossed_out = (await client.post(url, json=review("CREATE", crossed))).json()["response"]
        assert crossed_out["allowed"] is False and "spec.rl.miniBatchSize: 1000 is larger than rl.batchSize" in crossed_out["status"]["message"]
        update = (await client.post(url, json=review("UPDATE", edited, running_rl))).json()["response"]
        assert update["allowed"] is False and "spec.rl: cannot change after stage rl started" in update["status"]["message"]
        assert (await client.get(health)).status_code == 200
