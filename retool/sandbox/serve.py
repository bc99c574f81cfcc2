"""Run a sandbox replica: ``retool sandbox serve`` and ``python -m retool.sandbox``."""

from __future__ import annotations

import argparse
import logging

from retool.sandbox import isolation, logs
from retool.sandbox.settings import SandboxSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default 127.0.0.1; 0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, help="port (default 8080)")
    parser.add_argument("--workers", type=int, help="concurrent executions of this replica (default 16)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def settings_from(args: argparse.Namespace) -> SandboxSettings:
    """Environment (RETOOL_SANDBOX_*) first, flags override it."""
    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "workers": args.workers}.items() if v is not None}
    return SandboxSettings(**overrides)


def serve(settings: SandboxSettings, log_level: str = "info") -> None:
    """Serve until SIGTERM/SIGINT, then drain: stop accepting, report not-ready, let running
    requests finish for at most ``drain_timeout_s``, stop the workers and exit."""
    import uvicorn

    from retool.sandbox import run_route
    from retool.sandbox.http_limits import guarded_protocol
    from retool.sandbox.server import create_app

    logs.configure(getattr(logging, log_level.upper()))
    # Root-owned /proc entries: code running as the same uid cannot read our environment.
    isolation.set_dumpable(False)
    app = create_app(settings)
    metrics = app.state.metrics
    protocol = guarded_protocol(
        max_connections=settings.max_connections,
        idle_timeout_s=settings.idle_timeout_s,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        write_timeout_s=settings.write_timeout_s,
        handler_timeout_s=settings.handler_timeout_s,
        max_unsent_bytes=settings.max_unsent_bytes,
        pooled={("POST", run_route.PATH)},
        error_body=app.state.error_body,
        on_reject=lambda reason: metrics.http_rejected.labels(reason).inc(),
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol,
        ws="none",
        lifespan="on",
        timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]  (a float works: call_later)
        timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
        log_config=None,
        access_log=False,
        log_level=log_level,
    )
    pool = app.state.pool

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            pool.draining = True  # /readyz answers 503 from now on, new executions are refused
            super().handle_exit(sig, frame)

    DrainingServer(config).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.sandbox", description="SandboxFusion-compatible code sandbox")
    add_arguments(parser)
    args = parser.parse_args(argv)
    serve(settings_from(args), args.log_level)
    return 0
