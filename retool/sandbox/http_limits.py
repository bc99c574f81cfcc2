"""Request limits in front of the sandbox: what a client may cost the server before any code runs.

uvicorn closes only keep-alive connections that sit idle after a response: a connection that never
sends a request, or sends its headers one byte at a time, stays open forever, a write waits for ever
for a client that does not read, and every body is read whole into memory. Here:

- ``guarded_protocol``: uvicorn's httptools protocol with every phase of a connection bounded. A
  connection cap, an idle timeout (no request started), a header timeout and size cap, a body
  timeout; a bound on a request the pool does not bound (everything but ``POST /run_code``:
  ``handler_timeout_s``); and a bound on the answer's bytes waiting for the client to read them, per
  connection (``write_timeout_s``: a write that does not drain in time is aborted, the connection
  reset, never closed gracefully behind bytes nobody reads) and across the replica
  (``max_unsent_bytes``: past it the connections that have waited longest are aborted). An expired
  request is answered (408 for the header and body phases, 431 for oversized headers, 503 for a
  request the server gave up on) in the API's error shape when no response has started, and its
  connection closed. Only live connections count against the cap: a closing one has no request
  left and its unsent bytes are bounded as above. At the cap the oldest connection with no request
  being handled (idle first, then one whose answer waits unread, then one still sending headers,
  then a body) is closed to make room (an unread one is aborted): a flood of idle, slow or
  non-reading connections cannot lock out new clients, the kubelet's probes included. A new
  connection is refused (503) only when every open one has a request in the application, which the
  pool's queue and the bounds above limit.
- ``BodyLimit``: an ASGI middleware that answers 413 from the Content-Length header alone, before
  reading a byte of the body, and stops reading a chunked body the moment it goes over; and a budget
  of body bytes held across all connections at once (``InflightBudget``: the bytes that arrived, not
  those declared, so silent declarations hold nothing; 503 with Retry-After when a body's bytes do
  not fit), with the allocator's free memory given back to the system after a burst; and a cap on
  the JSON values a body may open, counted as its bytes arrive (``json_tokens``), so a body is
  bounded by shape before the parser runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import json
import socket
import struct
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

MAX_HEADER_BYTES = 64 << 10
"""Request line and headers together; a client never needs more for /run_code."""

TRIM_AFTER_BYTES = 4 << 20
"""A connection that held at least this many unsent bytes gives the allocator's free pages back when
its bytes go (drained or aborted): freed answers otherwise stay in the server's resident memory."""

Reject = Callable[[str], None]
ErrorBody = Callable[[str], bytes]

EVICTION_ORDER = {"idle": 0, "unread": 1, "header": 2, "body": 3}
"""Which connections make room at the cap, first to last ("unread": its answer waits for a client that
does not read it); one whose request is being handled never does."""


def eviction_candidate(connections: list[tuple[str, int]]) -> int | None:
    """Index of the connection to close at the cap, from (phase, opening order) pairs; None if none may go."""
    ranked = [(EVICTION_ORDER[phase], opened, index) for index, (phase, opened) in enumerate(connections) if phase in EVICTION_ORDER]
    return min(ranked)[2] if ranked else None


def default_error_body(message: str) -> bytes:
    """The API's error shape (``RunCodeResponse`` with status SandboxError), for callers that give none."""
    return json.dumps({"status": "SandboxError", "message": message}).encode()


def _raw_response(status: str, message: str, error_body: ErrorBody = default_error_body) -> bytes:
    body = error_body(message)
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )


class _WatchedTransport:
    """A connection's transport as uvicorn's protocol sees it: every close, uvicorn's own included
    (``Connection: close``, its keep-alive timer, shutdown), tells the guard, which bounds how long
    the bytes still queued may wait for the client."""

    __slots__ = ("_on_close", "_transport")

    def __init__(self, transport: asyncio.Transport, on_close: Callable[[], None]) -> None:
        self._transport = transport
        self._on_close = on_close

    def close(self) -> None:
        self._transport.close()
        self._on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(
    *,
    max_connections: int,
    idle_timeout_s: float,
    header_timeout_s: float,
    body_timeout_s: float,
    write_timeout_s: float = 30.0,
    handler_timeout_s: float = 10.0,
    max_unsent_bytes: int = 256 << 20,
    pooled: Collection[tuple[str, str]] = (),
    error_body: ErrorBody = default_error_body,
    on_reject: Reject | None = None,
) -> type[asyncio.Protocol]:
    """An uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) enforcing these limits.

    ``pooled``: the (method, path) of requests something else bounds (the pool: queue, run timeout);
    every other request is given up after ``handler_timeout_s``."""
    reject = on_reject or (lambda _reason: None)
    opening = itertools.count()
    trim = _malloc_trim()
    trim_pending = [False]

    def give_memory_back(loop: asyncio.AbstractEventLoop) -> None:
        """One ``malloc_trim`` soon, however many large holders go at once."""
        if trim_pending[0]:
            return
        trim_pending[0] = True

        def run() -> None:
            trim_pending[0] = False
            trim()

        loop.call_soon(run)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
            """The phase's: idle, header, body."""
            self._handler_timer: asyncio.TimerHandle | None = None
            """The running request's, when the pool does not bound it."""
            self._write_timer: asyncio.TimerHandle | None = None
            """The unsent bytes': armed while the answer waits for the client."""
            self._opened = next(opening)
            self._phase = "idle"
            self._header_bytes = 0
            self._waiting_since: float | None = None
            """Since when bytes wait for the client: over the transport's high-water mark, or queued on a closing transport."""
            self._held_peak = 0
            self._lost = False

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
                self._refuse("408 Request Timeout", f"the request's {phase} did not arrive in time")
            else:
                self.transport.close()

        def _response_started(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete and cycle.response_started

        def _refuse(self, status: str, message: str) -> None:
            self._disarm()
            self.transport.write(_raw_response(status, message, error_body))
            self.transport.close()

        # -- requests the pool does not bound --------------------------------------------------
        def _pipelined(self, cycle: RequestResponseCycle) -> bool:
            return any(queued is cycle for queued, _ in self.pipeline)

        def _handle(self, cycle: RequestResponseCycle) -> None:
            """``cycle``'s request has reached the application: bound it unless the pool does."""
            self._cancel_handler()
            if (cycle.scope.get("method"), cycle.scope.get("path")) not in pooled:
                self._handler_timer = self.loop.call_later(handler_timeout_s, self._give_up, cycle)

        def _cancel_handler(self) -> None:
            if self._handler_timer is not None:
                self._handler_timer.cancel()
                self._handler_timer = None

        def _give_up(self, cycle: RequestResponseCycle) -> None:
            self._handler_timer = None
            if self._lost or cycle.response_complete or self.transport.is_closing():
                return
            reject("handler_timeout")
            if cycle.response_started:  # half an answer cannot be finished cleanly
                self._abort()
                return
            cycle.disconnected = True  # whatever the application still sends goes nowhere
            cycle.message_event.set()
            self._refuse("503 Service Unavailable", f"the server gave up on this request after {handler_timeout_s:g} s; retry")

        # -- unsent bytes ----------------------------------------------------------------------
        def _closed(self) -> None:
            """The transport is closing (by the guard or by uvicorn): its queued bytes get the write bound."""
            if self._lost:
                return
            self._disarm()
            if self.transport.get_write_buffer_size() > 0:
                if self._waiting_since is None:
                    self._waiting_since = self.loop.time()
                self._bound_write()

        def _bound_write(self) -> None:
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(write_timeout_s, self._write_expired)

        def _write_expired(self) -> None:
            self._write_timer = None
            if not self._lost and self.transport.get_write_buffer_size() > 0:
                reject("write_timeout")
                self._abort()

        def _abort(self) -> None:
            """Reset the connection: its queued bytes are dropped now, not sent to a client that does not read."""
            self._disarm()
            self._cancel_handler()
            sock = self.transport.get_extra_info("socket")
            if sock is not None:  # linger 0: a reset, and the kernel's send queue dropped too (close() would leave it to drain)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()
            if self._held_peak >= TRIM_AFTER_BYTES:
                self._held_peak = 0
                give_memory_back(self.loop)

        def _enforce_unsent_budget(self) -> None:
            """Past ``max_unsent_bytes`` queued across the replica, abort the connections whose bytes
            have waited longest (never this one, whose answer was just written) until it fits."""
            held = self.transport.get_write_buffer_size()
            waiting = []
            for other in list(self.connections):
                if other is self or not isinstance(other, GuardedHttpToolsProtocol) or other._lost or other.transport is None:
                    continue
                size = other.transport.get_write_buffer_size()
                held += size
                if size and other._waiting_since is not None:
                    waiting.append((other._waiting_since, other._opened, size, other))
            waiting.sort(key=lambda entry: entry[:2])
            for _since, _opened, size, other in waiting:
                if held <= max_unsent_bytes:
                    break
                reject("unsent_budget")
                other._abort()
                held -= size

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._waiting_since is None:
                self._waiting_since = self.loop.time()
            self._held_peak = max(self._held_peak, self.transport.get_write_buffer_size())
            self._bound_write()
            self._enforce_unsent_budget()
            if self._held_peak >= TRIM_AFTER_BYTES:  # the copies the answer was made from are freed by the time this runs
                give_memory_back(self.loop)

        def resume_writing(self) -> None:
            super().resume_writing()
            if not self.transport.is_closing():
                self._waiting_since = None
                if self._write_timer is not None:
                    self._write_timer.cancel()
                    self._write_timer = None
            if self._held_peak >= TRIM_AFTER_BYTES:
                self._held_peak = 0
                give_memory_back(self.loop)

        # -- uvicorn's protocol ----------------------------------------------------------------
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_WatchedTransport(transport, self._closed))  # type: ignore[arg-type]
            if len(self.connections) > max_connections and self._live() > max_connections and not self._make_room():
                reject("connection_limit")
                self._refuse("503 Service Unavailable", "too many open connections")
                return
            self._arm("idle", idle_timeout_s)

        def _live(self) -> int:
            """Connections counted against the cap: those not closing (a closing one has no request left)."""
            return sum(1 for c in self.connections if c.transport is not None and not c.transport.is_closing())

        def _eviction_phase(self) -> str:
            return "unread" if self._waiting_since is not None else self._phase

        def _make_room(self) -> bool:
            """Close the oldest connection that has no request in the application; False if none may go."""
            others = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol) and c.transport is not None]
            others = [c for c in others if not c.transport.is_closing()]
            chosen = eviction_candidate([(c._eviction_phase(), c._opened) for c in others])
            if chosen is None:
                return False
            victim = others[chosen]
            reject("connection_evicted")
            if victim._waiting_since is not None:
                victim._abort()
            elif victim._phase == "idle":
                victim._disarm()
                victim.transport.close()
            else:
                victim._refuse("503 Service Unavailable", "connection closed to make room for others; retry")
            return True

        def connection_lost(self, exc: Exception | None) -> None:
            self._lost = True
            self._disarm()
            self._cancel_handler()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().connection_lost(exc)
            if self._held_peak >= TRIM_AFTER_BYTES:
                give_memory_back(self.loop)

        def send_400_response(self, msg: str) -> None:
            reject("bad_request")
            self._refuse("400 Bad Request", msg)

        def data_received(self, data: bytes) -> None:
            if self._phase in ("idle", "header"):
                # Counted before the parser sees them: a whole request in one read would otherwise be
                # parsed and dispatched before its size could be checked.
                end = data.find(b"\r\n\r\n")
                self._header_bytes += len(data) if end < 0 else end + 4
                if self._header_bytes > MAX_HEADER_BYTES:
                    reject("header_too_large")
                    self._refuse("431 Request Header Fields Too Large", "request headers too large")
                    return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm("header", header_timeout_s)

        def on_headers_complete(self) -> None:
            self._arm("body", body_timeout_s)
            self._header_bytes = 0
            super().on_headers_complete()
            if self.cycle is not None and not self._pipelined(self.cycle):
                self._handle(self.cycle)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._phase = "handling"

        def on_response_complete(self) -> None:
            following = self.pipeline[-1][0] if self.pipeline else None
            super().on_response_complete()
            self._cancel_handler()
            if following is not None and not self._pipelined(following):  # uvicorn started the next pipelined request
                self._handle(following)
            elif not self.transport.is_closing() and self._phase == "handling":
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

    Each body reserves its bytes as they arrive (never its Content-Length: two silent 32 MiB
    declarations took the whole budget and every /run_code was a 503 until the body timeout) and
    gives them back when its response is done; a body whose bytes do not fit is refused rather than
    buffered.
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
    the application never sees (or buffers) more than ``max_bytes``; the bytes of all bodies
    together stay within ``budget`` (503 with Retry-After beyond it).
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
        reserved = 0  # what arrived, never what was declared: a silent declaration holds nothing
        try:
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
                if not self.budget.reserve(len(chunk)):
                    self.reject("inflight_budget")
                    await self._refuse(send, 503, "too many request bytes in flight on this sandbox replica; retry")
                    return
                reserved += len(chunk)
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
