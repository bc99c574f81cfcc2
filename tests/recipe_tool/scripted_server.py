"""A real HTTP server on 127.0.0.1 whose answers a test scripts: for faults the real sandbox won't make on cue.

The real sandbox is started by tests/recipe_tool/test_tool_sandbox.py; this one answers every
``POST /run_code`` with a fixed status/body (always 429, a 400, a non-JSON 200...), a body chosen
per request (``respond``) or, by default, a SandboxFusion-shaped success after ``delay_s``, and
records what it saw (requests, peak concurrency). ``GET /v1/ping`` answers 200, as the sandbox's does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Script:
    status: int = 200
    body: str | None = None  # None: a Success answer echoing the code's length
    respond: Callable[[dict], str] | None = None  # the body for a request (before ``body``)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    requests: list[dict] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def sandbox_answer(stdout: str, stderr: str = "", return_code: int = 0) -> str:
    """A SandboxFusion ``/run_code`` body for a run that finished with this output."""
    status = "Success" if return_code == 0 else "Failed"
    return json.dumps(
        {"status": status, "message": "", "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": return_code, "stdout": stdout, "stderr": stderr}}
    )


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            payload = b"pong" if self.path == "/v1/ping" else b"not found"
            self.send_response(200 if self.path == "/v1/ping" else 404)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            with script.lock:
                script.requests.append(request)
                script.in_flight += 1
                script.peak_in_flight = max(script.peak_in_flight, script.in_flight)
            try:
                time.sleep(script.delay_s)
                body = script.respond(request) if script.respond is not None else script.body
                if body is None:
                    body = sandbox_answer(f"ran {len(request.get('code', ''))} chars\n")
                payload = body.encode()
                self.send_response(script.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for key, value in script.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)
            finally:
                with script.lock:
                    script.in_flight -= 1

    return Handler


@contextmanager
def scripted_sandbox(script: Script) -> Iterator[str]:
    """Serve ``script`` on a free loopback port; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
