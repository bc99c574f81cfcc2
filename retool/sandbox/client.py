"""Async client of the sandbox (and of any SandboxFusion server) for the code-interpreter tool.

One pooled ``httpx.AsyncClient`` per client object, shared by every rollout of a worker. The sandbox
refuses work it cannot start soon (429/503 with Retry-After) instead of letting requests hang, so the
client's job is to retry those, and connection errors (a replica restarting), with jittered
exponential backoff until a total deadline, then raise a typed error the tool turns into text.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from types import TracebackType

import httpx
from pydantic import ValidationError

from retool.retry_after import parse_retry_after
from retool.sandbox.api import RunCodeRequest, RunCodeResponse

logger = logging.getLogger(__name__)

OVERLOADED_STATUSES = frozenset({429, 503})
UNAVAILABLE_STATUSES = frozenset({500, 502, 504})


class SandboxError(Exception):
    """Any failure to get an answer from the sandbox (base class)."""


class SandboxUnavailable(SandboxError):  # noqa: N818 (name fixed by the tool interface)
    """Connection errors or 5xx answers persisted until the deadline."""


class SandboxOverloaded(SandboxError):  # noqa: N818 (name fixed by the tool interface)
    """The sandbox kept refusing work (429/503) until the deadline."""


def backoff_delay(attempt: int, *, base_s: float, max_s: float, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based).

    Full jitter (uniform in [0, min(max, base * 2**attempt)]) spreads the retries of many rollouts that
    were refused at the same moment. A server's Retry-After is a floor: it knows its queue, we do not.
    """
    rng = rng or random
    ceiling = min(max_s, base_s * (2**attempt))
    delay = rng.uniform(0, ceiling)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s * rng.uniform(1.0, 1.2))
    return delay



def sandbox_failure_status(exc: SandboxError) -> str:
    """The tool outcome name of a call the sandbox did not run: overloaded, unavailable or sandbox_error."""
    if isinstance(exc, SandboxOverloaded):
        return "overloaded"
    if isinstance(exc, SandboxUnavailable):
        return "unavailable"
    return "sandbox_error"

class SandboxClient:
    """Pooled async client: ``async with SandboxClient(url) as sb: await sb.run_code("print(1)")``."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int = 64,
        deadline_s: float = 120.0,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 2.0,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        self.base_url = base_url.rstrip("/")
        self.deadline_s = deadline_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(deadline_s, connect=min(10.0, deadline_s)),
        )

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def ping(self) -> bool:
        """True when the server answers ``GET /v1/ping`` with pong (no retries)."""
        try:
            response = await self._http.get("/v1/ping", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and "pong" in response.text

    async def run_code(
        self,
        code: str,
        *,
        run_timeout: float = 30.0,
        memory_limit_mb: int = 1024,
        stdin: str | None = None,
        files: dict[str, str] | None = None,
        fetch_files: list[str] | None = None,
        language: str = "python",
    ) -> RunCodeResponse:
        """Run ``code`` and return the server's answer (whose status may be Failed: the code failed).

        Raises SandboxOverloaded / SandboxUnavailable when no answer came before the deadline, and
        SandboxError when the server rejected the request itself (retrying would not help).
        """
        request = RunCodeRequest(
            code=code,
            language=language,
            run_timeout=run_timeout,
            memory_limit_MB=memory_limit_mb,
            stdin=stdin,
            files=dict(files or {}),
            fetch_files=list(fetch_files or []),
        )
        return await self.run(request)

    async def run(self, request: RunCodeRequest) -> RunCodeResponse:
        """``POST /run_code`` with retries inside the deadline (see ``run_code``)."""
        payload = request.model_dump()
        loop_start = time.monotonic()
        deadline = loop_start + self.deadline_s
        attempt = 0
        last_problem = "no attempt made"
        overloaded = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            retry_after: float | None = None
            try:
                response = await self._http.post("/run_code", json=payload, timeout=httpx.Timeout(remaining, connect=min(10.0, remaining)))
            except httpx.TimeoutException as exc:
                # an attempt's timeout is the deadline's remainder: this one only says the time ran out,
                # so what the attempt before it met (a refused connection, a 503) is kept in the message
                before = "" if attempt == 0 or last_problem.startswith("no answer in time") else f"; the attempt before: {last_problem}"
                last_problem, overloaded = f"no answer in time ({type(exc).__name__}){before}", overloaded and bool(before)
            except httpx.TransportError as exc:
                last_problem, overloaded = f"connection error: {type(exc).__name__}: {exc}", False
            else:
                if response.status_code == 200:
                    return self._parse(response)
                if response.status_code in OVERLOADED_STATUSES:
                    last_problem, overloaded = f"HTTP {response.status_code}: {response.text[:200]}", True
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
                elif response.status_code in UNAVAILABLE_STATUSES:
                    last_problem, overloaded = f"HTTP {response.status_code}: {response.text[:200]}", False
                else:
                    raise SandboxError(f"sandbox rejected the request: HTTP {response.status_code}: {_message(response)}")
            delay = backoff_delay(attempt, base_s=self.backoff_base_s, max_s=self.backoff_max_s, retry_after_s=retry_after)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            logger.debug("sandbox attempt %d failed (%s); retrying in %.3fs", attempt + 1, last_problem, delay)
            await asyncio.sleep(min(delay, remaining))
            attempt += 1
        elapsed = time.monotonic() - loop_start
        error = SandboxOverloaded if overloaded else SandboxUnavailable
        raise error(f"sandbox at {self.base_url} gave no answer within {elapsed:.1f}s after {attempt + 1} attempt(s): {last_problem}")

    @staticmethod
    def _parse(response: httpx.Response) -> RunCodeResponse:
        try:
            return RunCodeResponse.model_validate_json(response.content)
        except ValidationError as exc:
            raise SandboxError(f"sandbox answered something that is not a RunCodeResponse: {exc.errors()[:2]}") from exc


def _message(response: httpx.Response) -> str:
    """The most readable part of an error body: SandboxFusion-style message, FastAPI detail, or text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])[:500]
    return response.text[:500]
