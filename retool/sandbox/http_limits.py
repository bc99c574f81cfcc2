"""Request limits in front of the sandbox: what a client may cost the server before any code runs.

uvicorn closes only keep-alive connections that sit idle after a response: a connection that never
sends a request, or sends its headers one byte at a time, stays open forever, and every body is
read whole into memory. Here:

- ``guarded_protocol``: uvicorn's httptools protocol with a connection cap, an idle timeout (no
  request started), a header timeout and size cap, and a body timeout. Each timer covers one phase
  of a request; an expired request is answered 408 (431 for oversized headers) when no response has
  started, and its connection closed. At the cap the oldest connection with no request being
  handled (idle first, then one still sending headers, then a body) is closed to make room: a
  flood of idle or slow connections cannot lock out new clients, the kubelet's probes included. A
  new connection is refused (503) only when every open one has a request in the application, which
  the pool's queue bounds.
- ``BodyLimit``: an ASGI middleware that answers 413 from the Content-Length header alone, before
  reading a byte of the body, and stops reading a chunked body the moment it goes over; and a budget
  of body bytes held across all connections at once (``InflightBudget``: 503 with Retry-After when
  a body does not fit), with the allocator's free memory given back to the system after a burst;
  and a cap on the JSON values a body may open, counted as its bytes arrive (``json_tokens``), so a
  body is bounded by shape before the parser runs on the event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 << 10
"""Request line and headers together; a client never needs more for /run_code."""

Reject = Callable[[str], None]

EVICTION_ORDER = {"idle": 0, "header": 1, "body": 2}
"""Which connections make room at the cap, first to last; one whose request is being handled never does."""


def eviction_candidate(connections: list[tuple[str, int]]) -> int | None:
    """Index of the connection to close at the cap, from (phase, opening order) pairs; None if none may go."""
    ranked = [(EVICTION_ORDER[phase], opened, index) for index, (phase, opened) in enumerate(connections) if phase in EVICTION_ORDER]
    return min(ranked)[2] if ranked else None


def _raw_response(status: str, message: str) -> bytes:
    body = message.encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


def guarded_protocol(
    *, max_connections: int, idle_timeout_s: float, header_timeout_s: float, body_timeout_s: float, on_reject: Reject | None = None
) -> type[asyncio.Protocol]:
    """An uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) enforcing these limits."""
    reject = on_reject or (lambda _reason: None)
    opening = itertools.count()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            self._opened = next(opening)
            self._phase = "idle"
            self._header_bytes = 0
            self._responded = False

        # -- timers --------------------------------------------------------------------------
        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._timer = self.loop.call_later(seconds, self._expire, phase)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self, phase: str) -> None:
            self._timer = None
            if self.transport is None or self.transport.is_closing():
                return
            reject(f"{phase}_timeout")
            if phase != "idle" and not self._response_started():
                self.transport.write(_raw_response("408 Request Timeout", f"the request's {phase} did not arrive in time"))
            self.transport.close()

        def _response_started(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete and cycle.response_started

        # -- uvicorn's protocol ----------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections and not self._make_room():
                reject("connection_limit")
                transport.write(_raw_response("503 Service Unavailable", "too many open connections"))
                transport.close()
                return
            self._arm("idle", idle_timeout_s)

        def _make_room(self) -> bool:
            """Close the oldest connection that has no request in the application; False if none may go."""
            others = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol) and c.transport is not None]
            others = [c for c in others if not c.transport.is_closing()]
            chosen = eviction_candidate([(c._phase, c._opened) for c in others])
            if chosen is None:
                return False
            victim = others[chosen]
            reject("connection_evicted")
            victim._disarm()
            if victim._phase != "idle":
                victim.transport.write(_raw_response("503 Service Unavailable", "connection closed to make room for others; retry"))
            victim.transport.close()
            victim.connections.discard(victim)
            return True

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._phase in ("idle", "header"):
                # Counted before the parser sees them: a whole request in one read would otherwise be
                # parsed and dispatched before its size could be checked.
                end = data.find(b"\r\n\r\n")
                self._header_bytes += len(data) if end < 0 else end + 4
                if self._header_bytes > MAX_HEADER_BYTES:
                    reject("header_too_large")
                    self._disarm()
                    self.transport.write(_raw_response("431 Request Header Fields Too Large", "request headers too large"))
                    self.transport.close()
                    return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm("header", header_timeout_s)

        def on_headers_complete(self) -> None:
            self._arm("body", body_timeout_s)
            self._header_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._phase = "handling"

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._phase == "handling":
                self._arm("idle", idle_timeout_s)

    return GuardedHttpToolsProtocol


Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``: give free heap pages back to the system (a no-op elsewhere)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    return (lambda: trim(0)) if trim is not None else (lambda: None)


class InflightBudget:
    """Request body bytes held at once across every connection.

    Each body reserves its size before it is read (its Content-Length, or chunk by chunk) and gives
    it back when its response is done; a body that does not fit is refused rather than buffered.
    When the last large body of a burst is released the allocator's free pages go back to the
    system: parsing big bodies leaves hundreds of MB of freed heap otherwise.
    """

    TRIM_AFTER_BYTES = 4 << 20

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._released_since_trim = 0
        self._trim = _malloc_trim()

    def reserve(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        self.held -= size
        self._released_since_trim += size
        if self.held == 0 and self._released_since_trim >= self.TRIM_AFTER_BYTES:
            self._released_since_trim = 0
            self._trim()


def json_tokens(chunk: bytes) -> int:
    """An upper bound on the JSON values a chunk of a body opens: its ``[``, ``{``, ``"`` and ``,``
    bytes (inside strings too, so never fewer). Every array, object, string and list item the parser
    would materialize needs one of them, so a body under the cap cannot expand into millions of
    objects: ``[[],[],...]`` in an ignored field took 29 MB of body to 800 MB of lists and a blocked
    event loop for seconds. Four ``bytes.count`` passes: about a millisecond per megabyte."""
    return chunk.count(b"[") + chunk.count(b"{") + chunk.count(b'"') + chunk.count(b",")


class BodyLimit:
    """ASGI middleware: request bodies over ``max_bytes`` are answered 413 and never read whole.

    The body is read here, counted as it arrives, and handed to the application in one piece, so
    the application never sees (or buffers) more than ``max_bytes``; all bodies together stay
    within ``budget`` (503 with Retry-After beyond it).
    """

    def __init__(
        self,
        app: Any,
        *,
        max_bytes: int,
        error_body: Callable[[str], bytes],
        on_reject: Reject | None = None,
        budget: InflightBudget | None = None,
        retry_after_s: int = 1,
        max_json_tokens: int | None = None,
    ) -> None:
        self.app = app
        self.max_json_tokens = max_json_tokens
        self.max_bytes = max_bytes
        self.error_body = error_body
        self.reject = on_reject or (lambda _reason: None)
        self.budget = budget or InflightBudget(1 << 62)
        self.retry_after_s = retry_after_s

    async def _refuse(self, send: Send, status: int, message: str) -> None:
        body = self.error_body(message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        if status == 503:
            headers.append((b"retry-after", str(self.retry_after_s).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [value for name, value in scope["headers"] if name == b"content-length"]
        if declared:
            try:
                length = int(declared[0])
            except ValueError:
                self.reject("bad_content_length")
                await self._refuse(send, 400, "invalid Content-Length")
                return
            if length > self.max_bytes:
                self.reject("body_too_large")
                await self._refuse(send, 413, f"request body of {length} bytes is over this sandbox's limit of {self.max_bytes}")
                return
        reserved = 0
        try:
            if declared and not self.budget.reserve(length):
                self.reject("inflight_budget")
                await self._refuse(send, 503, "too many request bytes in flight on this sandbox replica; retry")
                return
            reserved = length if declared else 0
            body = bytearray()
            tokens = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                if len(body) + len(chunk) > self.max_bytes:
                    self.reject("body_too_large")
                    await self._refuse(send, 413, f"request body is over this sandbox's limit of {self.max_bytes} bytes")
                    return
                if len(body) + len(chunk) > reserved:  # chunked, or longer than declared
                    more = len(body) + len(chunk) - reserved
                    if not self.budget.reserve(more):
                        self.reject("inflight_budget")
                        await self._refuse(send, 503, "too many request bytes in flight on this sandbox replica; retry")
                        return
                    reserved += more
                if self.max_json_tokens is not None:
                    tokens += json_tokens(chunk)
                    if tokens > self.max_json_tokens:
                        self.reject("body_shape")
                        await self._refuse(
                            send,
                            413,
                            f"request body has over {self.max_json_tokens} JSON values (counted by their '[', '{{', '\"' and ',' bytes):"
                            " over this sandbox's limit (max_body_json_tokens)",
                        )
                        return
                body += chunk
                if not message.get("more_body", False):
                    break
            whole: bytes | None = bytes(body)
            body.clear()  # one copy of the body from here on (Starlette keeps a lone bytes chunk as is)

            async def replay() -> dict[str, Any]:
                nonlocal whole
                if whole is not None:
                    data, whole = whole, None
                    return {"type": "http.request", "body": data, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.budget.release(reserved)
