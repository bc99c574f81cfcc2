"""``run_route`` reads a ``/run_code`` body exactly as FastAPI reads a body parameter of the same model.

The reference is FastAPI itself (the pinned 0.165.0), a route declared as the sandbox declared it
before ``run_route`` served it: each body of the table goes through both, and the two must agree on
the request they read, or on every error (type, location, message). The one deliberate difference
(a JSON body that is not text: FastAPI's catch-all 400 outside the API's error shape) is its own test.
"""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from retool.sandbox import run_route
from retool.sandbox.api import RunCodeRequest
from retool.sandbox.server import create_app, validation_answer
from retool.sandbox.settings import SandboxSettings

JSON = "application/json"

CASES = {
    "minimal": (b'{"code": "print(1)"}', JSON),
    "every field": (
        json.dumps(
            {"code": "x", "language": "python3", "compile_timeout": 1, "run_timeout": 2.5, "memory_limit_MB": 64, "stdin": "s"}
            | {"files": {"a": "YQ==", "b": None}, "fetch_files": ["a"]}
        ).encode(),
        JSON,
    ),
    "unknown fields are ignored": (b'{"code": "x", "extra": [1, {"y": 2}]}', JSON),
    "json with a charset": (b'{"code": "x"}', "application/json; charset=utf-8"),
    "a +json type": (b'{"code": "x"}', "application/vnd.api+json"),
    "upper-case type": (b'{"code": "x"}', "Application/JSON"),
    "text/plain is not json": (b'{"code": "x"}', "text/plain"),
    "no content type is not json": (b'{"code": "x"}', None),
    "application/x-www-form-urlencoded": (b"code=x", "application/x-www-form-urlencoded"),
    "empty body": (b"", JSON),
    "empty body, no type": (b"", None),
    "cut short": (b'{"code": ', JSON),
    "trailing garbage": (b'{"code": "x"} x', JSON),
    "an array": (b"[1, 2]", JSON),
    "a string": (b'"print(1)"', JSON),
    "null": (b"null", JSON),
    "a number": (b"5", JSON),
    "true": (b"true", JSON),
    "code missing": (b"{}", JSON),
    "code not a string": (b'{"code": 1}', JSON),
    "code null": (b'{"code": null}', JSON),
    "NaN timeout": (b'{"code": "x", "run_timeout": NaN}', JSON),
    "Infinity timeout": (b'{"code": "x", "compile_timeout": Infinity}', JSON),
    "zero timeout": (b'{"code": "x", "run_timeout": 0}', JSON),
    "timeout as text": (b'{"code": "x", "run_timeout": "3"}', JSON),
    "timeout not a number": (b'{"code": "x", "run_timeout": "soon"}', JSON),
    "fractional memory": (b'{"code": "x", "memory_limit_MB": 1.5}', JSON),
    "memory as a whole float": (b'{"code": "x", "memory_limit_MB": 64.0}', JSON),
    "files a list": (b'{"code": "x", "files": ["a"]}', JSON),
    "files value a number": (b'{"code": "x", "files": {"a": 1}}', JSON),
    "fetch_files a string": (b'{"code": "x", "fetch_files": "a"}', JSON),
    "several errors": (b'{"code": 1, "run_timeout": -1, "files": 3}', JSON),
    "a lone surrogate": (b'{"code": "\\ud800"}', JSON),
    "utf-16 with a bom": ('{"code": "x"}'.encode("utf-16"), JSON),
    "deep nesting in an ignored field": (b'{"code": "x", "extra": ' + b"[" * 50 + b"]" * 50 + b"}", JSON),
}


@pytest.fixture(scope="module")
def fastapi_reading() -> TestClient:
    """FastAPI's own reading of a ``RunCodeRequest`` body: the request, or the errors."""
    reference = FastAPI()
    read: list[RunCodeRequest] = []

    @reference.exception_handler(RequestValidationError)
    async def errors(_request: object, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"errors": [{"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]}, status_code=422)

    @reference.post("/run_code")
    async def run_code(body: RunCodeRequest) -> dict:
        read.append(body)
        return {"read": len(read) - 1}

    client = TestClient(reference)
    client.read = read  # type: ignore[attr-defined]
    return client


@pytest.mark.parametrize("raw,content_type", CASES.values(), ids=CASES.keys())
def test_a_body_is_read_as_fastapi_reads_it(fastapi_reading: TestClient, raw: bytes, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    reply = fastapi_reading.post("/run_code", content=raw, headers=headers)
    if reply.status_code == 200:
        expected = fastapi_reading.read[reply.json()["read"]]  # type: ignore[attr-defined]
        assert run_route.read_body(raw, content_type) == expected
        return
    assert reply.status_code == 422, reply.text
    with pytest.raises(run_route.InvalidBodyError) as refused:
        run_route.read_body(raw, content_type)
    ours = [{"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]} for e in refused.value.errors]
    assert ours == reply.json()["errors"]


def test_a_json_body_that_is_not_text_is_a_400_in_the_apis_shape(fastapi_reading: TestClient) -> None:
    raw = b'{"code": "\xff"}'
    assert fastapi_reading.post("/run_code", content=raw, headers={"content-type": JSON}).status_code == 400  # FastAPI's {"detail": ...}
    with pytest.raises(run_route.InvalidBodyError) as refused:
        run_route.read_body(raw, JSON)
    assert validation_answer(refused.value.errors) == (400, "invalid request: body: not UTF-8, UTF-16 or UTF-32 text")


def test_the_server_answers_run_code_through_the_route_and_the_rest_through_fastapi() -> None:
    """Refusals that need no worker: the route's (an invalid body, an invalid field), FastAPI's
    (another method, a trailing slash), and /run_code still in the API's schema."""
    client = TestClient(create_app(SandboxSettings(workers=1)))  # outside ``with``: no lifespan, no pool started
    bad = client.post("/run_code", content=b'{"code": ', headers={"content-type": JSON})
    assert bad.status_code == 422
    assert bad.json()["status"] == "SandboxError" and bad.json()["message"] == "invalid request: 9: JSON decode error"
    nan = client.post("/run_code", content=b'{"code": "x", "run_timeout": NaN}', headers={"content-type": JSON})
    assert nan.status_code == 400 and "run_timeout" in nan.json()["message"]
    language = client.post("/run_code", json={"code": "x", "language": "cobol"})
    assert language.status_code == 400 and "cobol" in language.json()["message"]
    assert client.get("/run_code").status_code == 405
    assert client.post("/run_code/", json={"code": "x"}, follow_redirects=False).status_code == 307
    schema = client.get("/openapi.json").json()
    assert "RunCodeRequest" in json.dumps(schema["paths"]["/run_code"]["post"]["requestBody"])
