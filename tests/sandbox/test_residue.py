"""Nothing of one execution is in the memory of the next (issue 23, item 1).

Executions are forked from a per-worker zygote that has never held a request or a result. If they
were forked from the worker itself (which parsed the last request and built its result), the
previous execution's code, stdin, files and output would sit in freed heap pages that the next
execution inherits and can read through ``/proc/self/mem``.

The reader never holds the secrets itself: it gets only their SHA-256 and hashes every
``MARK-<32 hex>`` it finds in its own writable memory.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.sandbox.conftest import RunningServer, start_server, stop_server

pytestmark = pytest.mark.slow


MODES = {
    "pod": ("pod", {}),
    "pod-userns on Linux 6.11 (Landlock ABI 5: signals not scoped)": ("pod-userns", {"RETOOL_SANDBOX_LANDLOCK_MAX_ABI": "5"}),
    "k8s-userns": ("k8s-userns", {}),
    "root": (None, {}),
}


@pytest.fixture(scope="module", params=MODES.values(), ids=MODES.keys())
def one_worker(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """One worker, so the reader runs on the worker (and zygote) the writer ran on."""
    kind, env = request.param
    running = start_server(1, kind=kind, **env)
    yield running
    stop_server(running)


READER = """
import hashlib, re
wanted = {WANTED!r}
found = set()
pattern = re.compile(rb"MARK-([0-9a-f]{{32}})")
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
    for line in maps:
        fields = line.split()
        if fields[1][:2] != "rw" or (len(fields) > 5 and fields[5].startswith("[v")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        try:
            mem.seek(start)
            data = mem.read(end - start)
        except OSError:
            continue
        for match in pattern.finditer(data):
            name = wanted.get(hashlib.sha256(match.group(1)).hexdigest())
            if name:
                found.add(name)
print(sorted(found))
"""


def test_an_execution_finds_nothing_of_the_previous_one_in_its_memory(one_worker: RunningServer) -> None:
    secrets = {kind: uuid.uuid4().hex for kind in ("code", "stdin", "file", "output")}
    wanted = {hashlib.sha256(token.encode()).hexdigest(): kind for kind, token in secrets.items()}
    writer = (
        f"secret = 'MARK-{secrets['code']}'\n"
        "import sys\nsys.stdin.read()\nopen('data.txt').read()\n"
        f"print(''.join(['MA', 'RK-', {secrets['output'][::-1]!r}[::-1]]) * 3)\n"
    )
    body = {
        "code": writer,
        "stdin": f"MARK-{secrets['stdin']}\n",
        "files": {"data.txt": base64.b64encode(f"MARK-{secrets['file']}".encode()).decode()},
        "run_timeout": 10,
    }
    first = httpx.post(f"{one_worker.url}/run_code", json=body, timeout=60).json()
    assert first["status"] == "Success", first
    assert secrets["output"] in first["run_result"]["stdout"]
    second = httpx.post(f"{one_worker.url}/run_code", json={"code": READER.format(WANTED=wanted), "run_timeout": 30}, timeout=90).json()
    assert second["status"] == "Success", second
    assert second["run_result"]["stdout"].strip() == "[]"


KILL_THE_ZYGOTE = """
import os, signal
for target in (os.getppid(), -os.getppid(), -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as exc:
        print(type(exc).__name__)
print("alive")
"""


def test_an_execution_cannot_kill_the_zygote_it_was_forked_from(one_worker: RunningServer) -> None:
    """Its parent, its parent's group, everything (-1): the execution survives, the worker too."""
    restarts = one_worker.readyz()["worker_restarts"]
    answer = httpx.post(f"{one_worker.url}/run_code", json={"code": KILL_THE_ZYGOTE, "run_timeout": 10}, timeout=60).json()
    assert answer["run_result"]["stdout"].splitlines()[-1] == "alive", answer
    after = httpx.post(f"{one_worker.url}/run_code", json={"code": "print('next')", "run_timeout": 10}, timeout=60).json()
    assert after["run_result"]["stdout"] == "next\n", after
    assert one_worker.readyz()["worker_restarts"] == restarts
