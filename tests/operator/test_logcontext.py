"""Every operator log line of a pass names its run (retool_operator.logcontext), whoever logs it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from retool_operator import logcontext
from retool_operator.runner import Reconciler


def test_records_made_inside_a_run_name_it_and_others_do_not(caplog: pytest.LogCaptureFixture) -> None:
    logcontext.install()
    logcontext.install()  # idempotent: one prefix, not two
    other = logging.getLogger("retool_operator.kube")
    with caplog.at_level(logging.INFO):
        with logcontext.about("ml", "demo"):
            other.warning("the API server throttled a request")
            logging.getLogger("kopf.objects").info("[ml/demo] kopf's own line")
        other.warning("between passes")
    assert [r.getMessage() for r in caplog.records] == ["[ml/demo] the API server throttled a request", "[ml/demo] kopf's own line", "between passes"]
    assert [r.run for r in caplog.records] == ["ml/demo", "ml/demo", "-"]


def test_a_pass_and_the_tasks_it_starts_log_under_their_run(caplog: pytest.LogCaptureFixture) -> None:
    """Reconciler's pass loop sets the run: two runs' passes at once each log under their own name."""
    logcontext.install()
    log = logging.getLogger("retool_operator.runner")
    reconciler = Reconciler.__new__(Reconciler)
    reconciler._running, reconciler._again, reconciler._unwell = {}, set(), {}

    async def reconcile(namespace: str, name: str) -> None:
        await asyncio.ensure_future(asyncio.to_thread(log.info, "child task of %s"))
        log.info("pass of %s/%s", namespace, name)

    reconciler.reconcile = reconcile  # type: ignore[method-assign]

    async def both() -> None:
        await asyncio.gather(reconciler.trigger("ml", "a"), reconciler.trigger("ml", "b"))

    with caplog.at_level(logging.INFO):
        asyncio.run(both())
    lines = sorted(r.getMessage() for r in caplog.records if r.name == "retool_operator.runner")
    assert lines == ["[ml/a] child task of %s", "[ml/a] pass of ml/a", "[ml/b] child task of %s", "[ml/b] pass of ml/b"]
