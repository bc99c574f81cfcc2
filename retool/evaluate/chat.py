"""A minimal async client of ``POST /v1/chat/completions`` with tool calling.

Only the fields every OpenAI-compatible server (vLLM, SGLang, TGI, the OpenAI API) shares are
used: ``messages``, ``tools``, ``n=1``, sampling parameters; in the answer ``choices[0].message``
with ``content`` and ``tool_calls`` and ``finish_reason``. Parsing is a pure function so that a
malformed answer becomes a clear error naming what is missing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class EndpointError(RuntimeError):
    """The chat endpoint failed or answered something that is not a chat completion."""


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters sent with every request (``None`` leaves the server's default)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None

    def payload(self) -> dict[str, Any]:
        fields = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens, "seed": self.seed}
        return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; ``arguments`` is the raw JSON text it wrote."""

    id: str
    name: str
    arguments: str

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class AssistantTurn:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Mapping[str, int] = field(default_factory=dict)

    def message(self, calls: Sequence[ToolCall] | None = None) -> dict[str, Any]:
        """The assistant message to append to the conversation, with ``calls`` (default: all of its tool
        calls); the API requires a tool message for every call the conversation carries.

        With calls, one trailing newline of the content is dropped: Qwen's chat templates (2.5 and 3)
        write a newline between the content and the first ``<tool_call>``, and vLLM's hermes parser
        leaves the one the model wrote there at the end of the content (the text before the call), so
        sending it back would show the model ``\n\n<tool_call>`` in the next turn's prompt where it
        generated (and RL trained on) ``\n<tool_call>``.
        """
        calls = self.tool_calls if calls is None else calls
        content = self.content.removesuffix("\n") if calls else self.content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [call.message() for call in calls]
        return message


def chat_request(model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], sampling: Sampling) -> dict[str, Any]:
    """The JSON body of one chat completion request."""
    body: dict[str, Any] = {"model": model, "messages": list(messages), "n": 1, **sampling.payload()}
    if tools:
        body["tools"] = list(tools)
        body["tool_choice"] = "auto"
    return body


def parse_completion(payload: Any, turn_index: int = 0) -> AssistantTurn:
    """The first choice of a chat completion answer.

    >>> parse_completion({"choices": [{"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]}).content
    '4'
    """
    if not isinstance(payload, Mapping):
        raise EndpointError(f"chat completion is not a JSON object: {str(payload)[:200]}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise EndpointError(f"chat completion has no 'choices': {str(payload)[:200]}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise EndpointError(f"choices[0] has no 'message': {str(choice)[:200]}")
    calls = []
    for position, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") if isinstance(raw, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise EndpointError(f"choices[0].message.tool_calls[{position}] has no function name: {str(raw)[:200]}")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):  # some servers send an object; the API says a JSON string
            arguments = json.dumps(arguments)
        call_id = raw.get("id") or f"call_{turn_index}_{position}"
        calls.append(ToolCall(id=str(call_id), name=function["name"], arguments=arguments))
    usage = payload.get("usage") if isinstance(payload.get("usage"), Mapping) else {}
    return AssistantTurn(
        content=message.get("content") or "",
        tool_calls=tuple(calls),
        finish_reason=choice.get("finish_reason"),
        usage={k: int(v) for k, v in usage.items() if isinstance(v, int)},
    )


class ChatClient:
    """Sends chat completions to one endpoint, retrying transient failures with exponential backoff.

    ``endpoint`` is the server's base URL (``http://host:8000`` or ``http://host:8000/v1``).
    """

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key: str | None = None,
        sampling: Sampling | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_connections: int = 64,
    ) -> None:
        self.url = completions_url(endpoint)
        self.model = model
        self.sampling = sampling or Sampling()
        self.retries = retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers, limits=httpx.Limits(max_connections=max_connections))

    async def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], turn_index: int = 0, sample_index: int = 0) -> AssistantTurn:
        """One assistant turn. With a seed, sample k of a problem uses ``seed + k``: the n samples differ
        (an equal seed would make a deterministic server answer n times the same) and stay reproducible."""
        sampling = self.sampling
        if sampling.seed is not None and sample_index:
            sampling = replace(sampling, seed=sampling.seed + sample_index)
        body = chat_request(self.model, messages, tools, sampling)
        for attempt in range(self.retries + 1):
            retry_in = self.backoff_s * 2**attempt
            try:
                response = await self._http.post(self.url, json=body)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise EndpointError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
                logger.warning("%s: %s, retrying in %.1fs", self.url, type(exc).__name__, retry_in)
            else:
                if response.status_code == 200:
                    try:
                        payload = response.json()
                    except ValueError as exc:
                        raise EndpointError(f"{self.url}: answer is not JSON: {response.text[:200]}") from exc
                    return parse_completion(payload, turn_index)
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    raise EndpointError(f"{self.url}: HTTP {response.status_code}: {response.text[:300]}")
                logger.warning("%s: HTTP %s, retrying in %.1fs", self.url, response.status_code, retry_in)
            await asyncio.sleep(retry_in)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()


def completions_url(endpoint: str) -> str:
    """``/v1/chat/completions`` under the endpoint, whether or not it already ends in ``/v1``."""
    base = endpoint.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def models_url(endpoint: str) -> str:
    """``/v1/models`` under the endpoint, as :func:`completions_url` places ``/v1/chat/completions``."""
    return completions_url(endpoint).removesuffix("/chat/completions") + "/models"


def check_served(endpoint: str, model: str, api_key: str | None = None, timeout_s: float = 5.0) -> None:
    """One ``GET /v1/models`` (OpenAI's list, as vLLM serves it: ``{"data": [{"id": ...}]}``, vLLM's
    ``ModelList`` in ``vllm/entrypoints/openai/protocol.py``): :class:`EndpointError` naming what is wrong and
    the next step, before anything depends on the endpoint."""
    url = models_url(endpoint)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EndpointError(f"cannot reach {url} ({type(err).__name__}: {err or 'no answer'}): start the model server there, or leave the endpoint unset") from None
    if answer.status_code != 200:
        raise EndpointError(f"GET {url} answered {answer.status_code}: is this an OpenAI-compatible server (vLLM: `vllm serve MODEL`)?")
    try:
        served = [str(card["id"]) for card in answer.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise EndpointError(f"GET {url} is not an OpenAI model list: is this an OpenAI-compatible server (vLLM: `vllm serve MODEL`)?") from None
    if model not in served:
        raise EndpointError(f"{url} does not serve {model!r}; it serves: {', '.join(served) or 'no model'}")
