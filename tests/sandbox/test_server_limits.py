"""What a client can cost the server before any code runs: body size, slow and idle connections,
their number, strings that cannot be encoded, oversized jobs, and how the server stops."""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from retool.sandbox import http_limits
from tests.sandbox.conftest import RunningServer, start_server, stop_server
from tests.sandbox.waiting import wait_until

pytestmark = pytest.mark.slow

MAX_BODY = 16 << 20
LIMITS = {
    "RETOOL_SANDBOX_MAX_BODY_BYTES": str(MAX_BODY),
    "RETOOL_SANDBOX_MAX_CONNECTIONS": "100",
    "RETOOL_SANDBOX_IDLE_TIMEOUT_S": "1",
    "RETOOL_SANDBOX_HEADER_TIMEOUT_S": "1.5",
    "RETOOL_SANDBOX_BODY_TIMEOUT_S": "1.5",
    "RETOOL_SANDBOX_TMP_SIZE_MB": "8",
    "RETOOL_SANDBOX_DRAIN_TIMEOUT_S": "2",
}


@pytest.fixture(scope="module")
def limited() -> Iterator[RunningServer]:
    running = start_server(2, **LIMITS)
    yield running
    if running.process.poll() is None:
        stop_server(running)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def response_head(sock: socket.socket, timeout: float) -> bytes:
    """What the server answered (up to its first 4 KiB) within ``timeout``; b'' if it only closed."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_a_300_mb_body_is_refused_before_it_is_read(limited: RunningServer) -> None:
    before = rss_mb(limited.pid)
    sock = socket.create_connection(("127.0.0.1", limited.port))
    size = 300 << 20
    sock.sendall(f"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())
    started = time.monotonic()

    def pour() -> None:  # a client that keeps sending: the server must not wait for (or keep) it
        chunk = b" " * (1 << 20)
        try:
            for _ in range(300):
                sock.sendall(chunk)
        except OSError:
            pass

    sender = threading.Thread(target=pour, daemon=True)
    sender.start()
    head = response_head(sock, timeout=5)
    elapsed = time.monotonic() - started
    sock.close()
    sender.join(timeout=5)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert elapsed < 2.0
    assert rss_mb(limited.pid) - before < 40, "the server buffered the body"


def test_a_chunked_body_is_cut_off_at_the_limit(limited: RunningServer) -> None:
    sock = socket.create_connection(("127.0.0.1", limited.port))
    sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * (1 << 20)
    sent = 0
    try:
        while sent < 3 * MAX_BODY:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
            if select.select([sock], [], [], 0)[0]:
                break
    except OSError:
        pass
    head = response_head(sock, timeout=5)
    sock.close()
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    # What the client got rid of includes both sockets' buffers (several MB on loopback).
    assert sent < 2 * MAX_BODY, f"the server took {sent >> 20} MB before refusing"


def test_idle_slow_and_surplus_connections_are_closed(limited: RunningServer) -> None:
    """500 connections against a cap of 100: the oldest make room for the newest at once, idle ones
    are closed after the idle timeout, slowloris ones (headers one line at a time) after the header
    timeout."""
    fds_before = len(os.listdir(f"/proc/{limited.pid}/fd"))
    evicted_before = limited.metric("retool_sandbox_http_rejected_total", reason="connection_evicted")
    open_socks: dict[socket.socket, str] = {}
    for i in range(500):  # interleaved, so both kinds are among the first 100 accepted
        sock = socket.create_connection(("127.0.0.1", limited.port))
        open_socks[sock] = "slow" if i % 5 < 2 else "idle"
        if open_socks[sock] == "slow":
            sock.sendall(b"POST /run_code HTTP/1.1\r\n")
    started = time.monotonic()
    closed_at: dict[str, list[float]] = {"idle": [], "slow": []}
    answers: list[bytes] = []
    next_drip = started + 0.4
    while open_socks and time.monotonic() - started < 6:
        readable, _, _ = select.select(list(open_socks), [], [], 0.1)
        for sock in readable:
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            if data:
                answers.append(data.split(b"\r\n", 1)[0])
                continue
            closed_at[open_socks.pop(sock)].append(time.monotonic() - started)
            sock.close()
        if time.monotonic() > next_drip:  # slowloris: one more header line, never the end of them
            for sock, kind in list(open_socks.items()):
                if kind == "slow":
                    with contextlib.suppress(OSError):
                        sock.sendall(b"X-Drip: 1\r\n")
            next_drip = time.monotonic() + 0.4
    for sock in open_socks:
        sock.close()
    assert not open_socks, f"{len(open_socks)} connections still open after 6 s"
    # The server's own count, not a time: on a busy machine it may accept the flood later than a timeout
    # would have fired. Each of the 400 over the cap evicts one (none is timed out before the cap is hit
    # unless accepting 100 connections took a whole second).
    made_room = limited.metric("retool_sandbox_http_rejected_total", reason="connection_evicted") - evicted_before
    assert made_room >= 390, f"the oldest connections were not closed to make room for new ones ({made_room:g} evicted)"
    assert b"HTTP/1.1 408 Request Timeout" in answers, "slow headers were not timed out"
    assert max(closed_at["idle"]) < 3.0 and max(closed_at["slow"]) < 3.5
    response = limited.request("POST", "/run_code", json={"code": "print('still serving')"}, timeout=10)
    assert response.json()["run_result"]["stdout"] == "still serving\n"
    wait_until(lambda: len(os.listdir(f"/proc/{limited.pid}/fd")) <= fds_before + 5, what="the server closing the flood's descriptors")
    assert limited.metric("retool_sandbox_http_rejected_total") >= 500


EVICTIONS = {
    "an idle connection goes before one sending headers": ([("header", 0), ("idle", 5)], 1),
    "one sending headers goes before one sending a body": ([("body", 0), ("header", 3)], 1),
    "the oldest of a phase goes first": ([("idle", 7), ("idle", 2), ("idle", 9)], 1),
    "one whose request is in the application never goes": ([("app", 0), ("app", 1)], None),
    "nothing to evict among none": ([], None),
}


@pytest.mark.parametrize(("connections", "expected"), EVICTIONS.values(), ids=EVICTIONS.keys())
def test_the_eviction_order_at_the_cap(connections: list[tuple[str, int]], expected: int | None) -> None:
    assert http_limits.eviction_candidate(connections) == expected


def accepted_connections(pid: int, port: int) -> int:
    """Connections to ``port`` the server process has accepted (its socket descriptors whose inode is
    an established TCP socket on that local port): exact, whatever other descriptors come and go."""
    inodes = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            inodes.add(fields[9])
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            count += link.startswith("socket:[") and link[8:-1] in inodes
    return count


def test_the_connection_cap_exactly_at_its_value() -> None:
    """At ``MAX_CONNECTIONS`` open connections none is closed; one more closes exactly one, the
    oldest idle one, even though an older one is still sending its headers."""
    cap = 12
    server = start_server(1, RETOOL_SANDBOX_MAX_CONNECTIONS=str(cap), RETOOL_SANDBOX_IDLE_TIMEOUT_S="120", RETOOL_SANDBOX_HEADER_TIMEOUT_S="120")
    try:
        wait_until(lambda: accepted_connections(server.pid, server.port) == 0, what="no connection open")
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"POST /run_code HTTP/1.1\r\n")  # in the header phase, the oldest of all
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(cap - 1)]
        everyone = [slow, *idle]
        wait_until(lambda: accepted_connections(server.pid, server.port) == cap, what=f"the server holding {cap} connections")
        assert select.select(everyone, [], [], 0)[0] == [], "a connection was closed at the cap itself"
        newest = socket.create_connection(("127.0.0.1", server.port))
        wait_until(lambda: select.select(everyone, [], [], 0)[0], what="one connection closed to make room")
        closed = select.select(everyone, [], [], 0)[0]
        assert closed == [idle[0]] and idle[0].recv(1) == b"", closed
        newest.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert response_head(newest, timeout=10).startswith(b"HTTP/1.1 200")
        for sock in (*everyone, newest):
            sock.close()
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("fetch_files entry", '{"code": "print(1)", "fetch_files": ["out\\ud800.txt"]}'),
        ("files key", '{"code": "print(1)", "files": {"in\\udfff.txt": ""}}'),
        ("code", '{"code": "print(\\"\\ud800\\")"}'),
        ("stdin", '{"code": "print(1)", "stdin": "\\udc80"}'),
    ],
    ids=["in a fetch_files path", "in a files path", "in the code", "in stdin"],
)
def test_a_lone_surrogate_is_a_400_and_costs_no_worker(limited: RunningServer, field: str, body: str) -> None:
    restarts = limited.readyz()["worker_restarts"]
    reply = limited.request("POST", "/run_code", content=body.encode(), headers={"content-type": "application/json"}, timeout=10)
    assert reply.status_code == 400, reply.text
    assert reply.json()["status"] == "SandboxError" and field in reply.json()["message"] and "surrogate" in reply.json()["message"]
    assert limited.readyz()["worker_restarts"] == restarts
    assert limited.request("POST", "/run_code", json={"code": "print(2)"}, timeout=10).json()["run_result"]["stdout"] == "2\n"


def test_files_over_the_scratch_quota_are_reported_as_too_large(limited: RunningServer) -> None:
    files = {"big.bin": base64.b64encode(b"\0" * (9 << 20)).decode()}
    reply = limited.request("POST", "/run_code", json={"code": "print(1)", "files": files}, timeout=30)
    assert reply.status_code == 413 and "scratch quota of 8 MB" in reply.json()["message"], reply.text


def pipe_descriptors(root: int) -> int:
    """Pipe descriptors held by ``root`` and every process below it (the server, its workers, their zygotes)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        grew, tree = bool(below), tree | below
    count = 0
    for pid in tree:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:")
    return count


def test_a_deep_files_path_is_refused_before_any_worker_and_a_failed_write_leaks_no_descriptor(limited: RunningServer) -> None:
    """Issue 49: a path 1000 directories deep made a worker hit the recursion limit and leak three pipes per
    request; now it is a 4xx at the door, and a write that fails in the worker (a file where a directory
    is asked for) closes every pipe of its execution."""
    deep = limited.request("POST", "/run_code", json={"code": "print(1)", "files": {"d/" * 1000 + "f": "YQ=="}}, timeout=10)
    assert deep.status_code in (400, 422) and "components" in deep.json()["message"], deep.text
    clash = {"a": "YQ==", "a/b": "YQ=="}  # "a" is written as a file, then "a/b" needs it as a directory
    first = limited.request("POST", "/run_code", json={"code": "print(1)", "files": clash}, timeout=30).json()
    assert first["status"] == "SandboxError" and "could not write the request's files" in first["message"], first
    before = pipe_descriptors(limited.pid)
    for _ in range(20):
        limited.request("POST", "/run_code", json={"code": "print(1)", "files": clash}, timeout=30)
    # A leak is 2-3 pipes per failed request (60 here); the slack is both ends of one pre-forked execution's four pipes per worker (2 workers),
    # which a worker may hold or not at either count depending on where it is between two executions.
    slack = 16
    wait_until(lambda: pipe_descriptors(limited.pid) <= before + slack, what=f"the workers holding at most {slack} more pipes than before 20 failed writes", timeout_s=30)
    assert limited.request("POST", "/run_code", json={"code": "print(2)"}, timeout=10).json()["run_result"]["stdout"] == "2\n"


def test_zz_sigterm_drains_running_requests_within_the_bound(limited: RunningServer) -> None:
    """Runs last: stops the module's server. A request that can finish within the drain timeout
    does; one that cannot is answered 503 when the timeout runs out; the server is gone soon after."""
    results: dict[str, object] = {}

    def call(name: str, code: str) -> None:
        try:
            reply = limited.request("POST", "/run_code", json={"code": code, "run_timeout": 60}, timeout=30)
            results[name] = (reply.status_code, reply.json())
        except httpx.HTTPError as exc:
            results[name] = exc

    short = threading.Thread(target=call, args=("short", "import time\ntime.sleep(0.5)\nprint('finished')"))
    long = threading.Thread(target=call, args=("long", "import time\ntime.sleep(30)"))
    short.start()
    long.start()
    wait_until(lambda: limited.metric("retool_sandbox_busy_workers") == 2, what="both requests running")
    os.kill(limited.pid, signal.SIGTERM)
    signalled = time.monotonic()
    limited.process.wait(timeout=20)
    stopped = time.monotonic() - signalled
    short.join(timeout=5)
    long.join(timeout=5)
    assert results["short"][1]["run_result"]["stdout"] == "finished\n", results["short"]  # type: ignore[index]
    status, body = results["long"]  # type: ignore[misc]
    assert status == 503 and "shut down before this execution finished" in body["message"], body
    assert stopped < 2 + 6.0, f"the server took {stopped:.1f}s to stop"  # drain + stopping the workers, on a loaded machine

