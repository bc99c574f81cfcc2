"""The reward watch's second verifier (math-verify) against our reward on the reward's own case table.

The watcher re-grades every case in its verifier process, as it does a training step's sample; its
disagreement table must hold exactly the cases where the two are known to differ, in the direction
they differ. Most are answer shapes our reward was taught to accept (issue 15: framebox, choice
letters, repeating decimals, vulgar fractions, invisible characters) or text it was taught to ignore
(tool output, code fences, negated statements) - which is why the watch reports a rate to follow
over a run, not a verdict on one response.
"""

from __future__ import annotations

import pytest

from retool.recipe.reward.score import compute_score
from retool.recipe.reward_watch import WatchSettings
from retool.recipe.verl_plugins.watch import BatchWatcher, Sample
from tests.recipe_reward.cases import ALL

REWARD_RIGHT_VERIFIER_WRONG = {
    "last boxed wins over an earlier one",
    "fbox is a box",
    "boxed with space before the brace",
    "empty last boxed falls back to the previous box",
    "unclosed tool output at the end is ignored",
    "python fence with boxed string is ignored",
    "whitespace inside the box",
    "unicode degree sign",
    "thin-space thousands separator",
    "en dash as minus",
    "percent sign",
    "trailing period in box",
    "scientific e notation",
    "choice letter with its value",
    "choice letter against the letter",
    "framebox is a box",
    "framebox with a width",
    "repeating decimal",
    "repeating decimal after fixed digits",
    "varnothing is the empty set",
    "empty braces are the empty set",
    "percent equals the fraction it names",
    "fraction against a percent truth",
    "unicode vulgar fraction",
    "mixed number with a vulgar fraction",
    "zero-width space inside a number",
    "byte-order mark inside a number",
    "deep nesting of braces",  # math-verify gives up (its parsing timeout)
    "thousands of boxes",
    "zero-width characters everywhere",
}
REWARD_WRONG_VERIFIER_RIGHT = {
    "a bare number in prose is not an answer",
    "only interpreter has a box: no answer",
    "boxed printed by code is not the answer",
    "tool_response block is ignored",
    "a negated statement is not the answer",
    "many unclosed tool tags",
}


@pytest.fixture(scope="module")
def verified() -> tuple[dict, dict]:
    watcher = BatchWatcher(tokenizer=None, response_length=1, settings=WatchSettings(share=1.0, max_per_step=len(ALL)), use_mlflow=False)
    samples = [
        Sample(row=i, problem=case.id, answer=case.truth, response=case.response, reward_correct=compute_score("dapo_math", case.response, case.truth)["acc"] == 1.0)
        for i, case in enumerate(ALL)
    ]
    try:
        return watcher.verify(samples)
    finally:
        watcher.close()


def test_the_disagreement_table_holds_exactly_the_known_differences_in_their_direction(verified: tuple[dict, dict]) -> None:
    _, table = verified
    rows = list(zip(table["problem"], table["reward_correct"], table["verifier_correct"], strict=True))
    assert {p for p, reward, verifier in rows if reward and not verifier} == REWARD_RIGHT_VERIFIER_WRONG
    assert {p for p, reward, verifier in rows if verifier and not reward} == REWARD_WRONG_VERIFIER_RIGHT
    assert set(table) == {"row", "problem", "answer", "reward_pred", "response_tail", "reward_correct", "verifier_correct"}
    assert all(len(tail) <= 600 for tail in table["response_tail"])


def test_the_rates_count_the_same_disagreements(verified: tuple[dict, dict]) -> None:
    metrics, _ = verified
    n = len(ALL)
    assert metrics["reward-watch/verified"] == n
    assert metrics["reward-watch/reward_right_verifier_wrong"] == pytest.approx(len(REWARD_RIGHT_VERIFIER_WRONG) / n)
    assert metrics["reward-watch/reward_wrong_verifier_right"] == pytest.approx(len(REWARD_WRONG_VERIFIER_RIGHT) / n)
    assert metrics["reward-watch/disagreement_rate"] == pytest.approx((len(REWARD_RIGHT_VERIFIER_WRONG) + len(REWARD_WRONG_VERIFIER_RIGHT)) / n)
