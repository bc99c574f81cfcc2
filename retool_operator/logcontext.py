"""Every operator log line names the run it is about (``[namespace/name]``), whoever logs it.

A pass of a run is one asyncio task (``Reconciler._pass_loop``); :func:`about` sets the run in a
context variable for it, and asyncio copies context into the tasks a pass starts. The record factory
installed by :func:`install` puts the run in front of the message of every record made meanwhile -
the operator's modules, the API client's retries, the MLflow client's warnings - and sets
``record.run`` for formats that want it as a field. kopf's own per-object lines already start with
the same ``[namespace/name]`` and are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

RUN: ContextVar[str | None] = ContextVar("retool_operator_run", default=None)


@contextlib.contextmanager
def about(namespace: str, name: str) -> Iterator[None]:
    """Log lines made inside name the run ``namespace/name``."""
    token = RUN.set(f"{namespace}/{name}")
    try:
        yield
    finally:
        RUN.reset(token)


def install() -> None:
    """Wrap the logging module's record factory once (idempotent)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_retool_run_factory", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        run = RUN.get()
        record.run = run or "-"
        if run is not None and isinstance(record.msg, str) and not record.msg.startswith(f"[{run}]"):
            record.msg = f"[{run}] {record.msg}"
        return record

    factory._retool_run_factory = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
