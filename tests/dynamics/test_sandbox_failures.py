"""Which trajectories a step leaves out for sandbox failures, and when it refuses to train (retool.recipe.sandbox_failures)."""

from __future__ import annotations

import pytest

from retool.recipe.dynamics import OUTCOME_CLASS, tool_record
from retool.recipe.sandbox_failures import SandboxOutageError, check_share, decide_mask, sandbox_failed


def rec(*outcomes: str) -> dict:
    return tool_record(list(outcomes), [1] * len(outcomes), 0 if outcomes else None)


@pytest.mark.parametrize(
    ("outcome", "failed"),
    sorted((o, c == "sandbox_failure") for o, c in OUTCOME_CLASS.items()),
    ids=[f"{o} {'is' if c == 'sandbox_failure' else 'is not'} the sandbox's failure" for o, c in sorted(OUTCOME_CLASS.items())],
)
def test_only_calls_the_sandbox_did_not_run_count_as_its_failure(outcome: str, failed: bool) -> None:
    assert sandbox_failed([rec("ok", outcome)]).tolist() == [failed]


@pytest.mark.parametrize(
    ("records", "groups", "failed", "orphaned"),
    [
        ([rec("ok"), rec("ok"), rec("ok")], ["a", "a", "a"], [0, 0, 0], [0, 0, 0]),
        ([rec("ok"), rec("overloaded"), rec()], ["a", "a", "a"], [0, 1, 0], [0, 0, 0]),
        ([rec("ok"), rec("ok", "unavailable")], ["a", "a"], [0, 1], [1, 0]),
        ([rec("sandbox_error"), rec("tool_error")], ["a", "a"], [1, 1], [0, 0]),
        ([rec("ok"), rec("unavailable"), rec("ok")], ["a", "b", "c"], [0, 1, 0], [0, 0, 0]),
        ([rec("timeout"), rec("code_failed"), None], ["a", "a", "a"], [0, 0, 0], [0, 0, 0]),
    ],
    ids=[
        "nothing failed: nothing left out",
        "a failed call leaves its trajectory out, the rest of the group stays",
        "a group of two that keeps one leaves the survivor out too",
        "a group that lost everything has no survivor",
        "a group of one keeps verl's rule (rollout.n 1)",
        "the model's timeouts and errors, and a record-less row, stay in",
    ],
)
def test_decide_mask(records: list, groups: list, failed: list, orphaned: list) -> None:
    decision = decide_mask(records, groups)
    assert decision.failed.tolist() == [bool(x) for x in failed]
    assert decision.orphaned.tolist() == [bool(x) for x in orphaned]
    assert decision.metrics() == {
        "tool/masked_sandbox_failure_count": float(sum(failed)),
        "tool/masked_orphaned_count": float(sum(orphaned)),
        "tool/masked_ratio": (sum(failed) + sum(orphaned)) / len(records),
    }


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 records but 1 group ids"):
        decide_mask([rec(), rec()], ["a"])


def test_a_share_at_the_bound_trains_and_above_it_fails_naming_the_cause_and_the_field() -> None:
    decision = decide_mask([rec("ok"), rec("overloaded"), rec("ok"), rec("ok")], ["a", "a", "a", "a"])
    check_share(decision, 0.25, step=3)
    expected = r"step 3: 1 of 4 trajectories .* \(overloaded 1 calls\) .*25\.0% would be left out, above spec\.rl\.maxSandboxFailureShare 24\.0%"
    with pytest.raises(SandboxOutageError, match=expected) as raised:
        check_share(decision, 0.24, step=3)
    assert raised.value.metrics == decision.metrics()
    check_share(decide_mask([], []), 0.0, step=1)
