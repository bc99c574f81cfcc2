"""A pass that a throttled or unwell API server stopped is requeued with back-off (``Reconciler._pass_loop``);
any other failure is left to the next event or resync, and a pass that succeeds resets the back-off."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from retool_operator.kube import ApiError, Credentials, KubeClient
from retool_operator.runner import Reconciler
from tests.operator.helpers import CONFIG

KEY = ("ml", "demo")


class Script:
    """``Reconciler.reconcile`` replaced by a list of outcomes: an exception to raise, or None."""

    def __init__(self, outcomes: list[Exception | None]):
        self.outcomes = outcomes
        self.calls = 0

    async def __call__(self, namespace: str, name: str) -> Any:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return None


def reconciler(outcomes: list[Exception | None]) -> tuple[Reconciler, Script]:
    rec = Reconciler(KubeClient(Credentials(server="https://127.0.0.1:1")), CONFIG, post_event=lambda *_: None)
    script = Script(outcomes)
    rec.reconcile = script  # type: ignore[method-assign]
    return rec, script


def requeued_in(rec: Reconciler) -> float | None:
    timer = rec._timers.get(KEY)
    return None if timer is None else timer.when() - asyncio.get_running_loop().time()


THROTTLED = ApiError(429, "POST /apis/ray.io/v1/namespaces/ml/rayjobs: too many requests", retry_after=3)


@pytest.mark.parametrize(
    ("error", "at_least", "at_most"),
    [
        (THROTTLED, 2.9, 3.0),  # the server's Retry-After
        (ApiError(503, "GET ...: the server is currently unable to handle the request"), 0.9, 1.0),
        (aiohttp.ServerDisconnectedError(), 0.9, 1.0),
        (asyncio.TimeoutError(), 0.9, 1.0),
    ],
    ids=["throttled-honours-retry-after", "unavailable", "connection-dropped", "timed-out"],
)
async def test_a_pass_stopped_by_an_unwell_api_server_is_requeued(error: Exception, at_least: float, at_most: float) -> None:
    rec, script = reconciler([error])
    await rec.trigger(*KEY)
    delay = requeued_in(rec)
    rec.shutdown()
    assert script.calls == 1 and delay is not None and at_least <= delay <= at_most


@pytest.mark.parametrize("error", [ApiError(403, "forbidden"), ValueError("a bug")], ids=["a-refusal", "a-bug"])
async def test_other_failures_wait_for_the_next_event_or_resync(error: Exception) -> None:
    rec, _ = reconciler([error])
    await rec.trigger(*KEY)
    assert requeued_in(rec) is None


async def test_the_requeue_delay_doubles_up_to_the_resync_interval_and_resets_after_a_good_pass() -> None:
    unavailable = ApiError(503, "unavailable")
    rec, _ = reconciler([unavailable] * 7 + [None, unavailable])
    delays = []
    for _ in range(9):
        await rec.trigger(*KEY)
        delays.append(requeued_in(rec))
        if delays[-1] is not None:
            rec.shutdown()
    rounded = [None if d is None else round(d) for d in delays]
    assert rounded == [1, 2, 4, 8, 16, 30, 30, None, 1]  # CONFIG's resync interval: 30 s
