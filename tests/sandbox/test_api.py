"""The HTTP surface: probes, metrics, validation errors, limits, isolation between executions, backpressure."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from retool.sandbox.client import SandboxClient, SandboxError, SandboxOverloaded, SandboxUnavailable
from tests.conftest import free_port
from tests.sandbox.conftest import RunningServer, start_server, stop_server
from tests.sandbox.waiting import until

pytestmark = pytest.mark.slow


def test_probes_and_ping(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/v1/ping").json() == "pong"
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True and body["live_workers"] == server.workers
    assert set(body["isolation"]) >= {"mode", "network_isolated", "pid_namespace", "privilege_drop", "problems"}


def test_metrics_are_prometheus_text(server: RunningServer) -> None:
    httpx.post(f"{server.url}/run_code", json={"code": "print(1)"})
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "retool_sandbox_requests_total",
        "retool_sandbox_request_seconds_bucket",
        "retool_sandbox_queue_depth",
        "retool_sandbox_busy_workers",
        "retool_sandbox_worker_restarts_total",
        "retool_sandbox_timeouts_total",
        "retool_sandbox_memory_kills_total",
    ):
        assert name in text
    assert server.metric("retool_sandbox_requests_total") >= 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"code": "print(1)", "language": "cpp"}, "language 'cpp' is not supported"),
        ({"code": "print(1)", "run_timeout": 10_000}, "run_timeout 10000.0 is over"),
        ({"code": "print(1)", "memory_limit_MB": 10**6}, "memory_limit_MB 1000000 is over"),
        ({"code": "print(1)", "files": {"../x": ""}}, "leaves the execution directory"),
        ({"code": "print(1)", "files": {"/etc/x": ""}}, "must be relative"),
        ({"code": "print(1)", "files": {"a.txt": "not base64!"}}, "is not valid base64"),
        ({"code": "print(1)", "fetch_files": ["../../etc/shadow"]}, "leaves the execution directory"),
    ],
    ids=["other languages are refused", "timeout over the maximum", "memory over the maximum", "file path escaping", "absolute file path", "bad base64", "fetch escaping"],
)
def test_bad_requests_get_400_naming_the_problem(server: RunningServer, body: dict, message: str) -> None:
    reply = httpx.post(f"{server.url}/run_code", json=body)
    assert reply.status_code == 400
    assert reply.json()["status"] == "SandboxError"
    assert message in reply.json()["message"]


def test_missing_code_is_a_validation_error(server: RunningServer) -> None:
    assert httpx.post(f"{server.url}/run_code", json={"language": "python"}).status_code == 422


async def test_no_state_leaks_between_executions(server: RunningServer) -> None:
    """Globals, files, environment, module state and cwd of one execution are gone for the next."""
    first = (
        "import os, math\nLEAK = 1\nopen('left.txt', 'w').write('x')\nos.environ['LEAK'] = '1'\nmath.LEAK = 1\n"
        "import numpy as np\nprint(np.random.rand())"
    )
    second = (
        "import os, math\nprint('LEAK' in globals(), os.path.exists('left.txt'), 'LEAK' in os.environ, hasattr(math, 'LEAK'), sorted(os.listdir('.')))\n"
        "import numpy as np\nprint(np.random.rand())"
    )
    async with SandboxClient(server.url) as client:
        randoms = []
        for _ in range(server.workers * 2):  # every worker runs both, in some order
            a = await client.run_code(first, run_timeout=5)
            b = await client.run_code(second, run_timeout=5)
            assert b.run_result.stdout.splitlines()[0] == "False False False False []", b
            randoms += [a.run_result.stdout, b.run_result.stdout.splitlines()[1]]
    assert len(set(randoms)) == len(randoms), "numpy's random state was shared between executions"


async def test_output_is_capped_per_stream_with_a_marker(server: RunningServer) -> None:
    async with SandboxClient(server.url) as client:
        response = await client.run_code("import sys\nsys.stderr.write('e' * 3_000_000)\nprint('fine')", run_timeout=5)
    assert response.run_result.stdout == "fine\n"
    assert response.run_result.stderr.startswith("e" * 1000)
    assert "[output truncated: 3000000 bytes written, only the first 1048576 kept]" in response.run_result.stderr


async def test_client_raises_sandbox_error_on_bad_request(server: RunningServer) -> None:
    async with SandboxClient(server.url) as client:
        assert await client.ping()
        with pytest.raises(SandboxError, match="language 'rust' is not supported"):
            await client.run_code("fn main() {}", language="rust")


async def test_client_unavailable_when_nothing_listens() -> None:
    async with SandboxClient(f"http://127.0.0.1:{free_port()}", deadline_s=0.5) as client:
        assert not await client.ping()
        with pytest.raises(SandboxUnavailable, match="connection error"):
            await client.run_code("print(1)")


def scripted(*answers: type[httpx.TransportError] | int) -> httpx.AsyncClient:
    """A transport that meets each attempt with the next of ``answers`` (the last one repeats):
    an HTTP status, or an httpx transport error as httpx raises it; a timeout only once the
    attempt's own timeout (from the request, as httpx's transport reads it) has passed."""
    queue = list(answers)

    async def handle(request: httpx.Request) -> httpx.Response:
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, int):
            return httpx.Response(answer, text="busy", headers={"Retry-After": "0"})
        if issubclass(answer, httpx.TimeoutException):
            timeouts = request.extensions["timeout"]
            await asyncio.sleep(timeouts["connect" if answer is httpx.ConnectTimeout else "read"])
        raise answer("scripted", request=request)

    return httpx.AsyncClient(base_url="http://sandbox.test", transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("answers", "error", "says"),
    [
        pytest.param(
            (httpx.ConnectError, httpx.ConnectTimeout),
            SandboxUnavailable,
            "no answer in time (ConnectTimeout); the attempt before: connection error: ConnectError",
            id="refused, then the deadline ends mid-connect",
        ),
        pytest.param(
            (429, httpx.ReadTimeout),
            SandboxOverloaded,
            "no answer in time (ReadTimeout); the attempt before: HTTP 429",
            id="refused as overloaded, then the deadline ends mid-read",
        ),
        pytest.param((httpx.ConnectTimeout,), SandboxUnavailable, "after 1 attempt(s): no answer in time (ConnectTimeout)", id="the first attempt times out"),
    ],
)
async def test_an_attempt_cut_short_by_the_deadline_does_not_hide_what_the_attempt_before_met(answers: tuple, error: type[SandboxError], says: str) -> None:
    """Each attempt's timeout is what is left of the deadline, so the last one usually ends in a
    timeout that only says the time ran out: a replica that refused connections until then was
    reported as "no answer in time" alone (a loaded CI machine showed it)."""
    async with SandboxClient("http://sandbox.test", deadline_s=0.5) as client:
        await client._http.aclose()
        client._http = scripted(*answers)
        with pytest.raises(error) as raised:
            await client.run_code("print(1)")
    assert says in str(raised.value)


async def test_full_replica_refuses_at_once_and_client_backs_off() -> None:
    """One worker, no queue: a second request gets 429 + Retry-After immediately; the client retries it."""
    busy = start_server(workers=1, RETOOL_SANDBOX_QUEUE_SIZE="0")
    try:
        async with httpx.AsyncClient(base_url=busy.url, timeout=30) as http:
            slow = asyncio.create_task(http.post("/run_code", json={"code": "import time\ntime.sleep(1.5)\nprint('slept')", "run_timeout": 5}))
            await until(lambda: busy.metric("retool_sandbox_busy_workers") == 1, what="the slow request running")
            loop = asyncio.get_running_loop()
            started = loop.time()
            refused = await http.post("/run_code", json={"code": "print(1)"})
            assert refused.status_code == 429 and loop.time() - started < 0.5
            assert refused.headers["retry-after"] == "1" and refused.json()["status"] == "SandboxError"
            async with SandboxClient(busy.url, deadline_s=0.3, backoff_base_s=0.01) as impatient:
                with pytest.raises(SandboxOverloaded, match="HTTP 429"):
                    await impatient.run_code("print(2)")
            async with SandboxClient(busy.url, deadline_s=20) as patient:
                response = await patient.run_code("print(3)")
            assert response.run_result.stdout == "3\n"
            assert (await slow).json()["run_result"]["stdout"] == "slept\n"
        assert busy.metric("retool_sandbox_rejected_total") >= 2
    finally:
        stop_server(busy)


async def test_fetch_files_refuses_symlinks_out_of_the_directory(server: RunningServer) -> None:
    code = "import os\nos.symlink('/etc/hostname', 'link.txt')\nopen('real.txt', 'w').write('mine')"
    async with SandboxClient(server.url) as client:
        response = await client.run_code(code, fetch_files=["link.txt", "real.txt"])
    assert response.status == "Success", response
    assert set(response.files) == {"real.txt"}
    assert base64.b64decode(response.files["real.txt"]) == b"mine"
