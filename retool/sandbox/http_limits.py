"""Request limits in front of the sandbox: what a client may cost the server before any code runs.

uvicorn closes only keep-alive connections that sit idle after a response: a connection that never
sends a request, or sends its headers one byte at a time, stays open forever, and every body is
read whole into memory. Here:

- ``guarded_protocol``: uvicorn's httptools protocol with a connection cap (a connection beyond it
  is answered 503 and closed at once), an idle timeout (no request started), a header timeout and
  size cap, and a body timeout. Each timer covers one phase of a request; an expired request is
  answered 408 (431 for oversized headers) when no response has started, and its connection closed.
- ``BodyLimit``: an ASGI middleware that answers 413 from the Content-Length header alone, before
  reading a byte of the body, and stops reading a chunked body the moment it goes over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 << 10
"""Request line and headers together; a client never needs more for /run_code."""

Reject = Callable[[str], None]


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

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timer: asyncio.TimerHandle | None = None
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
            if len(self.connections) > max_connections:
                reject("connection_limit")
                transport.write(_raw_response("503 Service Unavailable", "too many open connections"))
                transport.close()
                return
            self._arm("idle", idle_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self._phase
            super().data_received(data)
            if before not in ("idle", "header") or self._phase not in ("idle", "header") or self.transport.is_closing():
                return  # headers complete (what followed them in ``data`` is body)
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                reject("header_too_large")
                self._disarm()
                self.transport.write(_raw_response("431 Request Header Fields Too Large", "request headers too large"))
                self.transport.close()

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


class BodyLimit:
    """ASGI middleware: request bodies over ``max_bytes`` are answered 413 and never read whole.

    The body is read here, counted as it arrives, and handed to the application in one piece, so
    the application never sees (or buffers) more than ``max_bytes``.
    """

    def __init__(self, app: Any, *, max_bytes: int, error_body: Callable[[str], bytes], on_reject: Reject | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.error_body = error_body
        self.reject = on_reject or (lambda _reason: None)

    async def _refuse(self, send: Send, status: int, message: str) -> None:
        body = self.error_body(message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
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
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                self.reject("body_too_large")
                await self._refuse(send, 413, f"request body is over this sandbox's limit of {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
