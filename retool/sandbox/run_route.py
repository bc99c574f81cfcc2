"""``POST /run_code`` served in front of FastAPI's router: the one route every execution takes.

Through FastAPI, a ``print(1+1)`` request spent ~0.2 ms of the server's CPU (a quarter of it) in
the framework: the exception and exit-stack middlewares, matching the path against every route,
the request object, dependency solving, per-request telemetry, and a JSON encoder built for each
response (bench/RESULTS.md, "Issue 35: /run_code in front of FastAPI"). At 16 concurrent requests
on two CPUs the sandbox is CPU-bound, so that is throughput. ``RunCodeRoute`` sits behind
``BodyLimit`` (which hands over the whole body in one message) and answers this route itself;
every other request goes on to FastAPI unchanged.

The body is read exactly as FastAPI 0.165.0 reads a JSON body parameter (``fastapi/routing.py``,
``get_request_handler``): parsed as JSON only when the content type is ``application/json`` or
``application/*+json`` (a missing one is not JSON: the route's default ``strict_content_type``);
otherwise the raw bytes are what gets validated; an empty body is no body; undecodable JSON is
one ``json_invalid`` error at the decoder's position. Then the model validates it as
``fastapi/_compat/v2.py``'s ``ModelField.validate`` does (``from_attributes=True``), and its errors
are located under ``body`` as FastAPI locates them. ``tests/sandbox/test_run_route.py`` holds the
two readings side by side against a FastAPI route for a table of bodies.
"""

from __future__ import annotations

import asyncio
import email.message
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response

from retool.sandbox.api import RunCodeRequest

PATH = "/run_code"
NOT_TEXT = "json_not_text"
"""The error type of a JSON body that is not text at all (not UTF-8, -16 or -32): FastAPI's catch-all
answered it with its own ``{"detail": ...}`` 400, outside the API's error shape; here it is a 400 in it."""

TOO_COMPLEX = "json_too_complex"
"""The error type of JSON the decoder refuses to build: an integer literal longer than
``MAX_INTEGER_DIGITS`` (Python's own limit, 4300 digits, raised ``ValueError``) or nesting deeper than the
interpreter's recursion limit (``RecursionError``). Both were plain-text 500s from the server; a 400 in
the API's shape now. No field of the API takes a number near that long."""
MAX_INTEGER_DIGITS = 64
"""Longer integer literals are refused as they are met (``parse_int``): a body of thousands of
4,000-digit integers cost seconds of the event loop's CPU in ``int()`` before anything was validated."""
THREAD_BODY_BYTES = 256 * 1024
"""Bodies at least this large are decoded off the event loop, so ``/healthz`` and other requests keep
their turns (the decoder holds the GIL, but the interpreter switches threads every few milliseconds)."""

Answer = Callable[[RunCodeRequest], Awaitable[Response]]
Refuse = Callable[[list[dict[str, Any]]], Response]


class InvalidBodyError(ValueError):
    """The body is not a valid ``RunCodeRequest``; ``errors`` as FastAPI's ``RequestValidationError`` lists them."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def read_body(raw: bytes, content_type: str | None) -> RunCodeRequest:
    """The request a body holds, or InvalidBodyError with errors located as FastAPI locates them."""
    if not raw:
        raise InvalidBodyError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    value: Any = raw
    if _is_json(content_type):
        try:
            value = json.loads(raw, parse_int=_bounded_int)
        except json.JSONDecodeError as exc:
            raise InvalidBodyError([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}]) from None
        except UnicodeDecodeError:
            raise InvalidBodyError([{"type": NOT_TEXT, "loc": ("body",), "msg": "not UTF-8, UTF-16 or UTF-32 text", "input": {}}]) from None
        except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep
            why = "nested too deep" if isinstance(exc, RecursionError) else f"holds an integer longer than {MAX_INTEGER_DIGITS} digits"
            raise InvalidBodyError([{"type": TOO_COMPLEX, "loc": ("body",), "msg": f"JSON {why}", "input": {}}]) from None
    try:
        return RunCodeRequest.model_validate(value, from_attributes=True)  # as fastapi/_compat/v2.py's ModelField.validate
    except ValidationError as exc:
        raise InvalidBodyError([{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]) from None


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"integer literal of {len(text)} characters")
    return int(text)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class RunCodeRoute:
    """ASGI middleware: ``POST /run_code`` is read (``read_body``) and answered here (``answer``,
    or ``refuse`` with the validation errors); anything else goes to ``app``."""

    def __init__(self, app: Any, *, answer: Answer, refuse: Refuse) -> None:
        self.app = app
        self.answer = answer
        self.refuse = refuse

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:  # one message behind BodyLimit; read on in case something else is in front
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        content_type = _header(scope, b"content-type")
        try:
            request = read_body(raw, content_type) if len(raw) < THREAD_BODY_BYTES else await asyncio.to_thread(read_body, raw, content_type)
        except InvalidBodyError as exc:
            response = self.refuse(exc.errors)
        else:
            response = await self.answer(request)
        await response(scope, receive, send)
