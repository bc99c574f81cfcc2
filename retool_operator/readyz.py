"""Reading each sandbox replica's /readyz isolation report (the I/O half of ``isolation``).

A replica decides its isolation once, when it starts, so one successful read per container start
(pod uid + restart count) is enough: later passes reuse it and a run's 256 replicas cost 256
requests once, not every pass. A failed read (the server still loading its template, a network
hiccup) is retried after ``RETRY_SECONDS``. The operator connects to the pod IP on the container's
declared port; the sandbox NetworkPolicy admits the operator's pods there (see ``isolation``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from retool.spec.names import SANDBOX_PORT
from retool_operator.isolation import READYZ_MAX_BYTES, ReplicaIsolation, parse_readyz

SANDBOX_CONTAINER = "sandbox"
RETRY_SECONDS = 10.0
TIMEOUT_SECONDS = 3.0
CONCURRENCY = 16


@dataclass(frozen=True)
class Target:
    """One sandbox container to ask: its pod, which start of it, and where it listens."""

    pod: str
    key: tuple[str, int]
    """(pod uid, restart count): a new key means a new server process, so a new plan."""
    url: str


def readable_pods(pods: list[dict[str, Any]]) -> list[Target]:
    """The sandbox pods whose server may answer: running, not being deleted, with an IP and a
    running sandbox container (not necessarily ready: a strict replica that is not strong never is)."""
    targets = []
    for pod in pods:
        meta, status, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
        ip = status.get("podIP")
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not ip:
            continue
        container = next((cs for cs in status.get("containerStatuses") or [] if cs.get("name") == SANDBOX_CONTAINER), None)
        if container is None or "running" not in (container.get("state") or {}):
            continue
        declared = next((c for c in spec.get("containers") or [] if c.get("name") == SANDBOX_CONTAINER), {})
        port = next((p.get("containerPort") for p in declared.get("ports") or [] if p.get("name") == "http"), SANDBOX_PORT)
        host = f"[{ip}]" if ":" in ip else ip
        key = (str(meta.get("uid") or meta.get("name")), int(container.get("restartCount") or 0))
        targets.append(Target(pod=str(meta.get("name")), key=key, url=f"http://{host}:{port}/readyz"))
    return targets


async def fetch_readyz(session: aiohttp.ClientSession, url: str) -> Any:
    """The JSON body of /readyz, 200 or 503 alike (bounded in size and time)."""
    async with session.get(url, allow_redirects=False) as response:
        raw = await response.content.read(READYZ_MAX_BYTES + 1)
        if len(raw) > READYZ_MAX_BYTES:
            raise ValueError(f"/readyz answered more than {READYZ_MAX_BYTES} bytes")
        if response.status not in (200, 503):
            raise ValueError(f"/readyz answered HTTP {response.status}")
        return json.loads(raw)


Fetch = Callable[[aiohttp.ClientSession, str], Awaitable[Any]]


class IsolationReader:
    """Per run: the last report of each current sandbox container, read when it is new."""

    def __init__(self, fetch: Fetch = fetch_readyz, now: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._now = now
        self._known: dict[tuple[str, str], dict[tuple[str, int], tuple[ReplicaIsolation, float]]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._limit = asyncio.Semaphore(CONCURRENCY)

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No proxy from the environment: the pod network is reached directly.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS), trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def forget(self, namespace: str, run: str) -> None:
        self._known.pop((namespace, run), None)

    async def read(self, namespace: str, run: str, pods: list[dict[str, Any]]) -> list[ReplicaIsolation]:
        """A report for every readable pod of the run (fresh where new or failed long enough ago)."""
        known = self._known.get((namespace, run), {})
        now = self._now()
        targets = readable_pods(pods)
        due = [t for t in targets if t.key not in known or (known[t.key][0].error is not None and now - known[t.key][1] >= RETRY_SECONDS)]
        fresh = await asyncio.gather(*(self._read_one(t) for t in due))
        current = {t.key: known[t.key] for t in targets if t.key in known}
        current.update({t.key: (report, now) for t, report in zip(due, fresh, strict=True)})
        self._known[(namespace, run)] = current
        return [current[t.key][0] for t in targets]

    async def _read_one(self, target: Target) -> ReplicaIsolation:
        async with self._limit:
            try:
                body = await self._fetch(await self._get_session(), target.url)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as err:
                return ReplicaIsolation(target.pod, error=f"{type(err).__name__}: {err}"[:300] or type(err).__name__)
        return parse_readyz(target.pod, body)
