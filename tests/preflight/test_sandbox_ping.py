"""The preflight's wait for the run's sandbox: seen soon after it answers, never waited past its deadline.

The server here is scripted: it answers ``/v1/ping`` 503 a set number of times (a sandbox whose pods
are still starting, as the Service's endpoints fill), then 200, and records when each try came.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

import pytest

from retool.preflight.sandbox_probe import PING_MAX_INTERVAL_S, _wait_for_ping
from tests.conftest import free_port


class StartingSandbox(ThreadingHTTPServer):
    def __init__(self, refusals: int) -> None:
        super().__init__(("127.0.0.1", 0), PingHandler)
        self.refusals = refusals
        self.tries: list[float] = []


class PingHandler(BaseHTTPRequestHandler):
    server: StartingSandbox

    def do_GET(self) -> None:
        self.server.tries.append(time.monotonic())
        ready = len(self.server.tries) > self.server.refusals
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def starting() -> Iterator[Callable[[int], StartingSandbox]]:
    servers: list[StartingSandbox] = []

    def start(refusals: int) -> StartingSandbox:
        server = StartingSandbox(refusals)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_sandbox_that_comes_up_is_seen_within_a_fraction_of_a_second(starting) -> None:
    """Three refusals then an answer: a fixed 1 s pause took 3 s here; 50+100+200 ms now."""
    server = starting(refusals=3)
    started = time.monotonic()
    assert asyncio.run(_wait_for_ping(f"http://127.0.0.1:{server.server_port}", 30.0)) is None
    assert len(server.tries) == 4
    gaps = [b - a for a, b in pairwise(server.tries)]
    assert all(b > a for a, b in pairwise(gaps)), f"the pauses must grow: {gaps}"
    assert time.monotonic() - started < 1.0


def test_pauses_stop_growing_at_a_second_and_the_deadline_is_kept(starting) -> None:
    server = starting(refusals=10_000)
    started = time.monotonic()
    error = asyncio.run(_wait_for_ping(f"http://127.0.0.1:{server.server_port}", 2.5))
    elapsed = time.monotonic() - started
    assert error == "HTTP 503"
    assert 2.5 <= elapsed < 2.5 + 0.5, "the last pause is cut to the deadline"
    gaps = [b - a for a, b in pairwise(server.tries)]
    assert max(gaps) < PING_MAX_INTERVAL_S + 0.2


def test_nothing_listening_is_reported_with_the_connection_error() -> None:
    error = asyncio.run(_wait_for_ping(f"http://127.0.0.1:{free_port()}", 0.3))
    assert error is not None and error.startswith("ConnectError")
