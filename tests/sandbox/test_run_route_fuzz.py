"""The hand-written ``/run_code`` body path under hostile bodies: every refusal is in the API's error format.

Seeded mutations of valid bodies (bytes flipped, cut, inserted; nesting thousands deep; integers of
thousands of digits; lone surrogates, BOMs, exponent bombs; odd content types) go through
``run_route.read_body`` and through the server's ASGI app: each is either a request the model accepts or
an ``InvalidBodyError`` answered 400/422 with the API's JSON (``status`` SandboxError), never another
exception, never a plain-text 500 (issue 49: a 4301-digit integer and 60,000 levels of nesting were).
"""

from __future__ import annotations

import json
import random

import pytest
from fastapi.testclient import TestClient

from retool.sandbox import run_route
from retool.sandbox.api import RunCodeRequest
from retool.sandbox.server import create_app, validation_answer
from retool.sandbox.settings import SandboxSettings

SEED = 49
JSON = "application/json"
VALID = [
    b'{"code": "print(1)"}',
    json.dumps({"code": "x = 1\nprint(x)", "run_timeout": 2.5, "memory_limit_MB": 64, "files": {"a.txt": "YQ=="}, "fetch_files": ["a.txt"]}).encode(),
    json.dumps({"code": "print(input())", "stdin": "7", "language": "python3"}).encode(),
]
HOSTILE = [
    b'{"code": "x", "n": ' + b"1" * 4301 + b"}",
    b'{"code": "x", "n": ' + b"[" * 60000 + b"]" * 60000 + b"}",
    b'{"code": "x", "n": ' + b'{"a":' * 30000 + b"1" + b"}" * 30000 + b"}",
    b'{"code": "x", "run_timeout": 1e999999999}',
    b'{"code": "x", "run_timeout": -' + b"9" * 5000 + b"}",
    b'{"code": "\\ud800\\udfff\\udc00"}',
    b"\xef\xbb\xbf" + b'{"code": "x"}',
    b'{"code": "x", "code": 1}',
    b'{"code": "x", "files": {"' + b"a/" * 2000 + b'f": "YQ=="}}',
    b"[" * 100000,
]
TYPES = [JSON, "application/json; charset=utf-16", "application/x+json", "text/plain", None, "application/json; boundary=\x00"]


def mutations(rng: random.Random, count: int) -> list[bytes]:
    out = list(HOSTILE)
    while len(out) < count:
        body = bytearray(rng.choice(VALID + HOSTILE[:3]))
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(len(body) + 1)
            kind = rng.randrange(4)
            if kind == 0 and body:
                body[min(where, len(body) - 1)] = rng.randrange(256)
            elif kind == 1:
                del body[where:]
            elif kind == 2:
                body[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                body[where:where] = rng.choice([b"[" * 5000, b"9" * 300, b"\\ud800", b'"', b"{", b"1e400", b"NaN", b"-0"])
        out.append(bytes(body))
    return out


BODIES = mutations(random.Random(SEED), 1500)


def test_every_hostile_body_is_a_request_or_a_refusal_in_the_apis_format() -> None:
    rng = random.Random(SEED + 1)
    refused = 0
    for raw in BODIES:
        content_type = rng.choice(TYPES)
        try:
            request = run_route.read_body(raw, content_type)
        except run_route.InvalidBodyError as exc:
            refused += 1
            status, message = validation_answer(exc.errors)
            assert status in (400, 422) and message.startswith("invalid request: "), (raw[:80], message)
            json.dumps({"status": "SandboxError", "message": message})  # what the server sends must be JSON
        else:
            assert isinstance(request, RunCodeRequest)
    assert refused > len(BODIES) // 2, "the mutations mostly break the bodies"


def refused(raw: bytes) -> bool:
    try:
        run_route.read_body(raw, JSON)
    except run_route.InvalidBodyError:
        return True
    return False


REFUSED = [raw for raw in HOSTILE if refused(raw)]
"""The hostile bodies the route refuses (the others are valid requests, run by a worker elsewhere)."""


def test_the_bodies_that_were_500s_are_refused() -> None:
    assert HOSTILE[0] in REFUSED and HOSTILE[1] in REFUSED and HOSTILE[2] in REFUSED


@pytest.mark.parametrize("raw", REFUSED, ids=[f"hostile {HOSTILE.index(r)}" for r in REFUSED])
def test_the_server_answers_each_refused_body_in_the_apis_format(raw: bytes) -> None:
    client = TestClient(create_app(SandboxSettings(workers=1)), raise_server_exceptions=False)  # outside ``with``: no pool started
    reply = client.post("/run_code", content=raw, headers={"content-type": JSON})
    assert reply.status_code in (400, 422), (reply.status_code, reply.text[:200])
    assert reply.headers["content-type"].startswith("application/json") and reply.json()["status"] == "SandboxError", reply.text[:200]


def test_a_long_integer_and_deep_nesting_are_400s_naming_why() -> None:
    for raw, why in ((HOSTILE[0], "an integer longer than 64 digits"), (HOSTILE[1], "nested too deep")):
        with pytest.raises(run_route.InvalidBodyError) as refused:
            run_route.read_body(raw, JSON)
        assert validation_answer(refused.value.errors) == (400, f"invalid request: body: JSON {'holds ' if 'integer' in why else ''}{why}")
