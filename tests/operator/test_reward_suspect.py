"""RewardSuspect: the rl stage's reward watch (an MLflow tag) becomes a condition and a Warning Event."""

from __future__ import annotations

import datetime as dt

import pytest

from retool.spec.status import RetoolRunStatus
from retool_operator import constants as c
from retool_operator.reconcile import Observed, decide
from tests.operator.helpers import T0, rayjob_status, run_of
from tests.operator.test_reconcile import stages

MESSAGE = "the second verifier disagreed with the reward on more than 10% of the re-graded responses for 3 steps in a row (step 40: 22%)"


def rl_running(conditions: list | None = None) -> RetoolRunStatus:
    return RetoolRunStatus(stages=stages(prepare=("Succeeded", 1), sft=("Succeeded", 1), merge=("Succeeded", 1), rl=("Running", 1)), conditions=conditions or [])


def suspect_of(status: RetoolRunStatus):
    return next((cond for cond in status.conditions if cond.type == c.COND_REWARD_SUSPECT), None)


def pass_with(status: RetoolRunStatus, suspect: str | None, now: dt.datetime = T0):
    return decide(run_of(), status, Observed(children={"demo-rl-1": rayjob_status("Running", "RUNNING")}, reward_suspect=suspect), now)


@pytest.mark.parametrize(
    ("suspect", "expected"),
    [(None, None), ("", None), (MESSAGE, ("True", c.REASON_REWARD_DISAGREES))],
    ids=["not read this pass: no condition", "never raised: no condition", "raised: condition True naming why"],
)
def test_a_first_reading(suspect: str | None, expected: tuple[str, str] | None) -> None:
    decision = pass_with(rl_running(), suspect)
    cond = suspect_of(decision.status)
    assert (cond.status, cond.reason) == expected if expected else cond is None
    warnings = [e for e in decision.events if e.reason == c.REASON_REWARD_DISAGREES]
    assert len(warnings) == (1 if suspect else 0)


def test_raised_once_kept_while_unread_and_cleared_to_false() -> None:
    raised = pass_with(rl_running(), MESSAGE)
    assert suspect_of(raised.status).message == MESSAGE
    again = pass_with(raised.status, MESSAGE, T0 + dt.timedelta(minutes=1))
    assert not [e for e in again.events if e.reason == c.REASON_REWARD_DISAGREES], "one Event when raised, not one per pass"
    unread = pass_with(again.status, None, T0 + dt.timedelta(minutes=2))
    assert suspect_of(unread.status) == suspect_of(raised.status), "a pass that could not read MLflow changes nothing"
    cleared = pass_with(unread.status, "", T0 + dt.timedelta(minutes=3))
    cond = suspect_of(cleared.status)
    assert (cond.status, cond.reason) == ("False", c.REASON_REWARD_AGREES)
    assert cond.last_transition_time != suspect_of(raised.status).last_transition_time
