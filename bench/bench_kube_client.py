"""CPU per request of the operator's API client (retool_operator.kube) against a loopback server.

Why: the operator's cost per run is mostly its API calls; this isolates the client from the
reconcile work. It compares ``KubeClient`` (kubernetes_asyncio's ApiClient with our
``JsonApiClient`` session and serializer) with the library's stock ``ApiClient`` under the same
calls, so the reason ``JsonApiClient`` exists stays measured. The server is a plain aiohttp app
in a subprocess on 127.0.0.1 answering every path with a Deployment-sized JSON body.

    .venv/bin/python bench/bench_kube_client.py [--rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from kubernetes_asyncio.client import ApiClient  # noqa: E402

from retool_operator import kube  # noqa: E402
from tests.conftest import free_port  # noqa: E402

ENV = [{"name": f"E{i}", "value": "v" * 20} for i in range(30)]
PATCH = {"metadata": {"labels": {f"k{i}": "v" for i in range(10)}}, "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i", "env": ENV}]}}}}

SERVER = textwrap.dedent(
    """
    import json, sys
    from aiohttp import web
    body = json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": "ns"}, "spec": %s}).encode()
    async def answer(request):
        await request.read()
        return web.Response(body=body, content_type="application/json", status=201 if request.method == "POST" else 200)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
    """
) % json.dumps(PATCH["spec"])


class StockClient(kube.KubeClient):
    """The same calls through kubernetes_asyncio's unmodified ApiClient (trust_env session, model serializer)."""

    def _new_api(self) -> ApiClient:
        api = ApiClient(kube.configuration_for(self._creds, self._tokens, concurrency=self._concurrency))
        api.user_agent = kube.USER_AGENT
        return api


async def measure(client: kube.KubeClient, rounds: int) -> float:
    """CPU ms per request: 10 concurrent GETs then 10 concurrent merge-patches, ``rounds`` times."""
    deployments = kube.KINDS[("apps/v1", "Deployment")]
    await client.get(deployments, "ns", "x")  # the session and its connection pool
    start = time.process_time()
    for _ in range(rounds):
        await asyncio.gather(*(client.get(deployments, "ns", "x") for _ in range(10)))
        await asyncio.gather(*(client.patch(deployments, "ns", "x", PATCH) for _ in range(10)))
    return (time.process_time() - start) * 1000 / (rounds * 20)


async def main(rounds: int) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        creds = kube.Credentials(server=f"http://127.0.0.1:{port}", token="bench")
        for name, factory in (("KubeClient (JsonApiClient)", kube.KubeClient), ("stock ApiClient", StockClient)):
            figures = []
            for _ in range(3):
                client = factory(creds)
                try:
                    figures.append(await measure(client, rounds))
                finally:
                    await client.close()
            print(f"{name:28s} CPU per request: " + ", ".join(f"{f:.3f}" for f in figures) + " ms")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    asyncio.run(main(parser.parse_args().rounds))
