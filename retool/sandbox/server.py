"""The sandbox's HTTP face: SandboxFusion's ``/run_code`` and ``/v1/ping``, plus probes and metrics.

Thin: validation and status codes here, everything about executing code in ``pool``/``worker``.
A full replica answers 429 with Retry-After at once (the client backs off), a replica without
workers (or draining, or refusing to run without strong isolation) 503; neither ever leaves a
caller hanging. Bodies over the configured size are 413 before they are read (``http_limits``); a
request whose strings cannot be encoded (lone surrogates) is a 400, as is any other invalid field.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from retool.sandbox import run_route
from retool.sandbox.api import RunCodeRequest, RunCodeResponse
from retool.sandbox.http_limits import BodyLimit, InflightBudget
from retool.sandbox.metrics import SandboxMetrics
from retool.sandbox.outcome import MIB, checked_relative_path
from retool.sandbox.pool import ExecutionPool, Job, JobTooLarge, PoolOverloaded, PoolUnavailable
from retool.sandbox.responses import build_response
from retool.sandbox.settings import SandboxSettings

logger = logging.getLogger("retool.sandbox.server")

LANGUAGES = frozenset({"python", "python3"})


class InvalidRequestError(ValueError):
    """The request cannot be run as given (answered 400 with a SandboxError body naming the field)."""

    status_code = 400


class RequestTooLargeError(InvalidRequestError):
    """The request is well-formed but bigger than an execution may hold (answered 413)."""

    status_code = 413


def _encodable(value: str | None, field: str) -> None:
    """Strings go to files, pipes and paths as UTF-8: a lone surrogate cannot, so it is refused here."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{field} is not valid Unicode text (a lone surrogate at position {exc.start})") from None


def job_from_request(request: RunCodeRequest, settings: SandboxSettings) -> Job:
    """Validate a request against this replica's limits; InvalidRequestError names what is wrong."""
    _encodable(request.code, "code")
    _encodable(request.stdin, "stdin")
    _encodable(request.language, "language")
    for path in request.files:
        _encodable(path, f"files key {path!r}")
    for path in request.fetch_files:
        _encodable(path, f"fetch_files entry {path!r}")
    if request.language.lower() not in LANGUAGES:
        raise InvalidRequestError(f"language {request.language!r} is not supported: this sandbox runs only python")
    if request.run_timeout > settings.max_run_timeout_s:
        raise InvalidRequestError(f"run_timeout {request.run_timeout} is over this sandbox's maximum of {settings.max_run_timeout_s} s")
    memory = request.memory_limit_MB
    if memory is None or memory <= 0:
        memory = settings.default_memory_limit_mb
    if memory > settings.max_memory_limit_mb:
        raise InvalidRequestError(f"memory_limit_MB {memory} is over this sandbox's maximum of {settings.max_memory_limit_mb}")
    if len(request.files) > settings.max_request_files:
        raise RequestTooLargeError(f"files has {len(request.files)} entries, over this sandbox's limit of {settings.max_request_files}")
    files_bytes = 0
    for path, content in request.files.items():
        try:
            checked_relative_path(path)
            files_bytes += len(base64.b64decode(content or "", validate=True))
        except ValueError as exc:
            detail = "is not valid base64" if isinstance(exc, binascii.Error) else str(exc)
            shown = path if len(path) <= 60 else path[:60] + "..."
            raise InvalidRequestError(f"files[{shown!r}]: {detail}") from exc
    if files_bytes > settings.tmp_size_mb * MIB:
        raise RequestTooLargeError(f"files total {files_bytes} bytes, over the execution's scratch quota of {settings.tmp_size_mb} MB")
    for path in request.fetch_files:
        try:
            checked_relative_path(path)
        except ValueError as exc:
            raise InvalidRequestError(f"fetch_files: {exc}") from exc
    return Job(
        code=request.code,
        run_timeout=request.run_timeout,
        memory_limit_mb=memory,
        stdin=request.stdin,
        files=dict(request.files),
        fetch_files=list(request.fetch_files),
    )


BAD_REQUEST_TYPES = frozenset({"finite_number", run_route.NOT_TEXT, run_route.TOO_COMPLEX})


def validation_answer(errors: list[dict]) -> tuple[int, str]:
    """Status and message for a body the model refuses: 400 for a non-finite number (NaN, Infinity:
    no limit can be computed from one), for a JSON body that is not text at all and for JSON too
    complex to decode (an integer too long, nesting too deep), 422 otherwise
    as FastAPI does; the inputs are never echoed (a NaN cannot even be written back as JSON)."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    status = 400 if any(error.get("type") in BAD_REQUEST_TYPES for error in errors) else 422
    return status, "invalid request: " + "; ".join(parts)


def create_app(settings: SandboxSettings | None = None) -> FastAPI:
    settings = settings or SandboxSettings()
    metrics = SandboxMetrics()
    pool = ExecutionPool(settings, metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        logger.info("sandbox ready", extra={"workers": settings.workers, "isolation": pool.isolation})
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="retool sandbox", description="SandboxFusion-compatible code sandbox", lifespan=lifespan)
    app.state.pool = pool
    app.state.settings = settings
    app.state.metrics = metrics

    def error_body(message: str) -> bytes:
        return RunCodeResponse(status="SandboxError", message=message, executor_pod_name=settings.pod_name).model_dump_json().encode()

    app.state.error_body = error_body  # the HTTP layer's own refusals (serve.py's guard) take the API's shape too

    def refuse(status_code: int, message: str, retry_after: int | None = None) -> JSONResponse:
        body = RunCodeResponse(status="SandboxError", message=message, executor_pod_name=settings.pod_name).model_dump()
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(body, status_code=status_code, headers=headers)

    async def answer_run_code(body: RunCodeRequest) -> Response:
        started = time.monotonic()
        try:
            job = job_from_request(body, settings)
        except InvalidRequestError as exc:
            metrics.requests.labels("Rejected").inc()
            return refuse(exc.status_code, str(exc))
        try:
            result = await pool.run(job)
        except asyncio.CancelledError:
            if not pool.draining:
                raise
            # The drain timeout ran out while this execution was still running: say so, clearly.
            metrics.requests.labels("Rejected").inc()
            return refuse(503, "the sandbox replica shut down before this execution finished; retry it", settings.retry_after_s)
        except JobTooLarge as exc:
            metrics.requests.labels("Rejected").inc()
            return refuse(413, str(exc))
        except PoolOverloaded as exc:
            metrics.requests.labels("Rejected").inc()
            metrics.rejected.inc()
            return refuse(429, f"sandbox busy: {exc}; retry later", settings.retry_after_s)
        except PoolUnavailable as exc:
            metrics.requests.labels("Rejected").inc()
            return refuse(503, f"sandbox unavailable: {exc}", settings.retry_after_s)
        response = build_response(result, settings.pod_name)
        elapsed = time.monotonic() - started
        metrics.requests.labels(response.status).inc()
        metrics.latency.observe(elapsed)
        if result.get("execution_time") is not None:
            metrics.execution.observe(result["execution_time"])
        if result.get("timed_out"):
            metrics.timeouts.inc()
        if result.get("memory_error"):
            metrics.memory_kills.inc()
        if result.get("limit_exceeded"):
            metrics.limit_kills.labels(result["limit_exceeded"]).inc()
        if result.get("output_truncated"):
            metrics.truncated.inc()
        run = response.run_result
        logger.log(
            logging.DEBUG if response.status == "Success" else logging.INFO,
            "run_code",
            extra={
                "status": response.status,
                "run_status": run.status if run else None,
                "return_code": run.return_code if run else None,
                "seconds": round(elapsed, 4),
                "timed_out": bool(result.get("timed_out")),
                "memory_error": bool(result.get("memory_error")),
                "worker_died": bool(result.get("worker_died")),
            },
        )
        return Response(response.model_dump_json().encode(), media_type="application/json")

    def refuse_invalid(errors: list[dict]) -> JSONResponse:
        status, message = validation_answer(errors)
        metrics.requests.labels("Rejected").inc()
        return refuse(status, message)

    # Behind BodyLimit (added last, so outermost): the route gets a body already bounded and whole.
    app.add_middleware(run_route.RunCodeRoute, answer=answer_run_code, refuse=refuse_invalid)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        error_body=error_body,
        on_reject=lambda reason: metrics.http_rejected.labels(reason).inc(),
        budget=InflightBudget(settings.max_inflight_body_bytes),
        retry_after_s=settings.retry_after_s,
        max_json_tokens=settings.max_body_json_tokens,
    )

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """Liveness: the event loop answers, and the replica has not been without a live worker for
        ``liveness_no_worker_s``. Dead workers are replaced by the pool; a replica that cannot
        replace any for that long (its scratch root unusable, the template failing) is restarted."""
        workerless = pool.workerless_for()
        if workerless > settings.liveness_no_worker_s:
            return JSONResponse({"status": "failing", "reason": f"no live worker for {workerless:.0f} s"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready when at least one warm worker is alive (and, in strict mode, the isolation is strong).

        The body says why not, and which isolation layers are in force (``isolation``).
        """
        snapshot = pool.snapshot()
        ready = pool.ready
        reasons = []
        if pool.draining:
            reasons.append("draining: the replica is shutting down")
        if pool.refusing:
            reasons.append(f"isolation required but not strong: {', '.join(snapshot['isolation'].get('problems', []))}")
        if not snapshot["live_workers"]:
            reasons.append("no live worker")
        return JSONResponse({"ready": ready, "not_ready_because": reasons if not ready else [], **snapshot}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.post(run_route.PATH, response_model=RunCodeResponse, response_model_exclude_none=False)
    async def run_code(body: RunCodeRequest) -> Response:
        """Declared here for the API's schema (/docs, /openapi.json); ``run_route.RunCodeRoute`` in
        front of the router reads the body as this declaration does and answers it."""
        return await answer_run_code(body)

    return app
