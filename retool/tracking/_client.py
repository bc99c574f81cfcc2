"""One MlflowClient per call, bound to an explicit tracking URI, with errors that name the server.

Never the fluent API (``mlflow.set_tracking_uri``/``start_run``): that keeps process-global
and thread-local state, and the operator talks to several tracking servers from worker threads.
An ``MlflowClient`` built per call carries its URI and nothing else, so every function in this
package may run concurrently in ``asyncio.to_thread``.

How long a call may block is MLflow's HTTP policy, read from the environment at call time:
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (default 7, with exponential backoff) and
``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default 120 s). The operator sets small values so an
unreachable tracker costs seconds and kopf retries the handler.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

COMMAND_LINE_HTTP_POLICY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""MLflow's HTTP policy for a command a person waits on: MLflow's defaults (7 retries, 120 s, backoff
factor 2) spend four minutes on a mistyped URL before saying so; two retries one and two seconds apart
say it in a few seconds and still ride out a blip."""

_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "host not found"),
    ("nodename nor servname", "host not found"),
    ("Temporary failure in name resolution", "host not found"),
    ("No route to host", "no route to host"),
    ("Network is unreachable", "network unreachable"),
    ("timed out", "no answer in time"),
    ("Connection reset", "connection reset"),
)


def fail_fast(environ: MutableMapping[str, str]) -> None:
    """Use ``COMMAND_LINE_HTTP_POLICY`` unless the user set MLflow's variables, and keep urllib3's
    per-retry warnings off a person's terminal: the one line that matters is ``TrackingError``'s."""
    import logging

    for key, value in COMMAND_LINE_HTTP_POLICY.items():
        environ.setdefault(key, value)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def unreachable_reason(exc: BaseException) -> str | None:
    """Why the server could not be reached ("connection refused", "host not found", ...), read from
    the chain of ``exc`` (MLflow raises its own exception inside the handler of requests' one, so the
    transport error is its ``__context__``), or None when the server answered."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        for needle, reason in _UNREACHABLE:
            if needle in text:
                return reason
        current = current.__cause__ or current.__context__
    return None


class TrackingError(RuntimeError):
    """An MLflow call failed; the message names the tracking server and the action."""


def client(tracking_uri: str | None) -> Any:
    from mlflow import MlflowClient

    if tracking_uri is not None and not tracking_uri:
        raise ValueError("tracking_uri is empty")
    return MlflowClient(tracking_uri=tracking_uri)


@contextlib.contextmanager
def reported(tracking_uri: str | None, action: str) -> Iterator[None]:
    """Re-raise MLflow and transport failures as TrackingError naming the server and what was attempted."""
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    try:
        yield
    except (MlflowException, RequestException, OSError) as exc:
        where = tracking_uri or "<default>"
        reason = unreachable_reason(exc)
        if reason is not None:  # one readable line, not urllib3's 300-character retry report
            raise TrackingError(f"MLflow at {where} is unreachable ({reason}): {action} failed") from exc
        raise TrackingError(f"MLflow at {where}: {action} failed: {exc}") from exc


def is_resource_exists(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) == "RESOURCE_ALREADY_EXISTS"
