"""An OpenAI-compatible chat server that plays scripted tool-calling conversations.

It is a real HTTP server on 127.0.0.1 (uvicorn in a thread), so ``retool eval`` is exercised
end to end: requests, tool-call round trips through the real sandbox, retries. Each script is
found by a marker in the user prompt; the reply depends on how many assistant turns the
conversation already has. It checks what it receives (the tool schema, and a ``tool`` message
answering every earlier call by id) and records the tool outputs, so a test can assert that the
model was shown the sandbox's real output. An answer may quote the last tool output, so it is
only correct when that output really came back.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass(frozen=True)
class Call:
    """Reply with a ``code_interpreter`` call (``raw_arguments`` overrides the JSON arguments)."""

    code: str = ""
    raw_arguments: str | None = None
    name: str = "code_interpreter"
    also: tuple[str, ...] = ()
    """Code of further calls in the same turn (parallel tool calls)."""


@dataclass(frozen=True)
class Say:
    """Reply with text; ``{last}`` is replaced by the stripped last tool output received."""

    text: str
    finish_reason: str = "stop"


@dataclass
class ScriptedEndpoint:
    model: str
    scripts: Mapping[str, list[Call | Say]]
    fail_first: set[str] = field(default_factory=set)
    """Markers whose first request gets a 503 (the client must retry)."""
    received_tool_messages: list[tuple[str, int, str]] = field(default_factory=list)
    requests: int = 0
    sampling: set[tuple[object, object, object]] = field(default_factory=set)
    """(temperature, top_p, seed) of every request."""
    problems: list[str] = field(default_factory=list)
    """Protocol violations seen (a test asserts this stays empty)."""

    def reply(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests += 1
        self.sampling.add((body.get("temperature"), body.get("top_p"), body.get("seed")))
        if body.get("model") != self.model:
            return 404, {"error": {"message": f"model {body.get('model')!r} not served"}}
        tool_names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if tool_names != ["code_interpreter"]:
            self.problems.append(f"tools sent: {tool_names}")
        messages = body.get("messages") or []
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        marker = next((m for m in self.scripts if m in user), None)
        if marker is None:
            return 400, {"error": {"message": "no script for this prompt"}}
        if marker in self.fail_first:
            self.fail_first.discard(marker)
            return 503, {"error": {"message": "warming up"}}
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        last_tool = self._check_tool_answers(marker, messages)
        step = self.scripts[marker][min(turn, len(self.scripts[marker]) - 1)]
        if isinstance(step, Say):
            message = {"role": "assistant", "content": step.text.replace("{last}", last_tool.strip())}
            return 200, _completion(self.model, message, step.finish_reason)
        arguments = step.raw_arguments if step.raw_arguments is not None else json.dumps({"code": step.code})
        calls = [{"id": f"call-{marker}-{turn}", "type": "function", "function": {"name": step.name, "arguments": arguments}}]
        for extra, code in enumerate(step.also, start=1):
            calls.append({"id": f"call-{marker}-{turn}-{extra}", "type": "function", "function": {"name": step.name, "arguments": json.dumps({"code": code})}})
        return 200, _completion(self.model, {"role": "assistant", "content": f"Let me compute (turn {turn}).", "tool_calls": calls}, "tool_calls")

    def _check_tool_answers(self, marker: str, messages: list[Mapping[str, Any]]) -> str:
        """Every earlier call must be answered by the next message, a tool message with its id."""
        last = ""
        for position, message in enumerate(messages):
            for call in message.get("tool_calls") or []:
                answer = messages[position + 1] if position + 1 < len(messages) else {}
                if answer.get("role") != "tool" or answer.get("tool_call_id") != call.get("id"):
                    self.problems.append(f"{marker}: call {call.get('id')} not answered by a tool message")
                    continue
                last = str(answer.get("content", ""))
        tool_messages = [m for m in messages if m.get("role") == "tool"]
        if tool_messages:
            self.received_tool_messages.append((marker, len(tool_messages), str(tool_messages[-1].get("content", ""))))
        return last

    def tool_outputs(self, marker: str) -> list[str]:
        return [content for m, _, content in self.received_tool_messages if m == marker]


def _completion(model: str, message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def build_app(endpoint: ScriptedEndpoint) -> FastAPI:
    app = FastAPI()
    lock = threading.Lock()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        # vLLM's ModelList (vllm/entrypoints/openai/protocol.py): OpenAI's list of model cards.
        return JSONResponse({"object": "list", "data": [{"id": endpoint.model, "object": "model", "created": int(time.time()), "owned_by": "vllm"}]})

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        with lock:
            status, payload = endpoint.reply(body)
        return JSONResponse(payload, status_code=status)

    return app


class ServerThread:
    """uvicorn serving the app on 127.0.0.1 in a daemon thread; ``url`` is its base URL."""

    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted endpoint did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


# A marker of each problem of retool/demo/data/aime_demo.jsonl -> code that computes its answer.
DEMO_SOLUTIONS = {
    "432 = 2^4": "n = 432\nsum(d for d in range(1, n + 1) if n % d == 0) % 1000",
    "3^{2026}": "pow(3, 2026, 1000)",
    "subsets of": "from itertools import combinations\nsum(1 for r in range(11) for c in combinations(range(1, 11), r) if sum(c) % 3 == 0)",
    "x^2 + y^2": "sum(1 for x in range(-10, 11) for y in range(-10, 11) if x * x + y * y <= 100)",
    "digits that sum": "sum(1 for n in range(1, 1000) if sum(map(int, str(n))) == 12)",
    "1^3 + 2^3": "sum(k ** 3 for k in range(1, 51)) % 1000",
}


def demo_scripts() -> dict[str, list[Call | Say]]:
    """Solve each of the demo's eval problems with one code call, then box what it printed."""
    return {marker: [Call(code), Say("\\boxed{{last}}")] for marker, code in DEMO_SOLUTIONS.items()}
