"""Evaluation metrics: hand-computed tables, and bit-for-bit parity with verl 0.6.1's own function."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mlflow.utils.validation import _validate_metric_name
from verl.trainer.ppo.metric_utils import bootstrap_metric as verl_bootstrap_metric
from verl.trainer.ppo.metric_utils import process_validation_metrics as verl_process_validation_metrics

from retool.recipe.metrics import (
    bootstrap_metric,
    bootstrap_sizes,
    majority_values,
    mlflow_metric_key,
    pass_at_k,
    process_validation_metrics,
    results_by_source,
    samples_from_rows,
    to_mlflow_metrics,
    validation_metrics,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        pytest.param(5, 2, 2, 1 - 3 / 10, id="two of five correct, k=2: 1 - C(3,2)/C(5,2)"),
        pytest.param(5, 0, 1, 0.0, id="nothing correct is zero"),
        pytest.param(5, 5, 3, 1.0, id="everything correct is one"),
        pytest.param(4, 1, 1, 0.25, id="pass@1 is the fraction correct"),
        pytest.param(10, 3, 5, 1 - 21 / 252, id="three of ten, k=5: 1 - C(7,5)/C(10,5)"),
        pytest.param(30, 1, 30, 1.0, id="one correct of thirty is found with k=n"),
        pytest.param(30, 1, 29, 1 - 1 / 30, id="one correct of thirty, k=29: missed only when it is the left-out sample"),
    ],
)
def test_pass_at_k_matches_the_binomial_formula(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [pytest.param(5, 6, 1, id="more correct than samples"), pytest.param(5, 2, 0, id="k zero"), pytest.param(5, 2, 6, id="k above n")],
)
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("n", "sizes"),
    [
        pytest.param(2, [2], id="two samples"),
        pytest.param(3, [2, 3], id="three samples"),
        pytest.param(4, [2, 4], id="power of two ends at n"),
        pytest.param(30, [2, 4, 8, 16, 30], id="thirty samples as in the AIME eval"),
        pytest.param(32, [2, 4, 8, 16, 32], id="thirty-two samples"),
    ],
)
def test_bootstrap_sizes_are_verls(n: int, sizes: list[int]) -> None:
    assert bootstrap_sizes(n) == sizes


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param([0, 1, 2], 0.0, id="b outvotes a, value of the first b"),
        pytest.param([3, 0, 1], 1.0, id="a outvotes b, value of the first a"),
        pytest.param([1, 0], 0.0, id="a tie goes to the vote seen first (b)"),
        pytest.param([0, 1], 1.0, id="a tie goes to the vote seen first (a)"),
        pytest.param([2, 2, 2], 0.0, id="a single vote repeated"),
    ],
)
def test_majority_value_of_one_resample(row: list[int], expected: float) -> None:
    values = np.array([1.0, 0.0, 0.0, 1.0])
    votes = np.array([0, 1, 1, 0])  # a, b, b, a
    assert majority_values(values, votes, np.array([row])).tolist() == [expected]


def _two_problems() -> tuple[list[str], list[str], dict[str, list]]:
    # u1: acc 1,0,1,1 answers 7,3,7,7 ; u2: acc 0,0,0,1 answers 5,5,2,9
    return (
        ["aime"] * 8,
        ["u1"] * 4 + ["u2"] * 4,
        {
            "reward": [1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0],
            "acc": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
            "pred": ["7", "3", "7", "7", "5", "5", "2", "9"],
        },
    )


def test_hand_computed_means_and_pass_at_k() -> None:
    metrics = validation_metrics(*_two_problems())
    assert metrics["val-core/aime/acc/mean@4"] == pytest.approx((0.75 + 0.25) / 2)
    assert metrics["val-aux/aime/acc/std@4"] == pytest.approx(math.sqrt(0.1875))
    assert metrics["val-aux/aime/reward/mean@4"] == pytest.approx((0.5 - 0.5) / 2)
    # pass@k: u1 has 3 of 4 correct, u2 1 of 4.
    assert metrics["val-aux/aime/acc/pass@1"] == pytest.approx((0.75 + 0.25) / 2)
    assert metrics["val-aux/aime/acc/pass@2"] == pytest.approx((1.0 + (1 - 3 / 6)) / 2)
    assert metrics["val-core/aime/acc/pass@4"] == pytest.approx(1.0)


def test_bootstrap_estimates_are_near_their_expectation() -> None:
    metrics = validation_metrics(*_two_problems())
    # best of 4 draws with replacement: u1 misses only if all four draws hit its one wrong answer.
    expected_best = ((1 - 0.25**4) + (1 - 0.75**4)) / 2
    assert metrics["val-core/aime/acc/best@4/mean"] == pytest.approx(expected_best, abs=0.03)
    # u2's most common answer (5) is wrong, so its majority vote is usually wrong while best-of finds the 9.
    assert metrics["val-core/aime/acc/maj@4/mean"] < metrics["val-core/aime/acc/best@4/mean"]


def test_constant_problems_have_exact_bootstrap_values() -> None:
    sources, uids = ["s"] * 6, ["solved"] * 3 + ["failed"] * 3
    infos = {"reward": [1.0, 1.0, 1.0, -1.0, -1.0, -1.0], "acc": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], "pred": ["4", "4", "4", "1", "2", "3"]}
    nested = process_validation_metrics(sources, uids, infos)
    assert nested["s"]["acc"]["best@3/mean"] == 0.5
    assert nested["s"]["acc"]["best@3/std"] == 0.0
    assert nested["s"]["acc"]["worst@3/mean"] == 0.5
    assert nested["s"]["acc"]["maj@3/mean"] == 0.5


def test_metric_names_and_sections_follow_verl() -> None:
    metrics = validation_metrics(*_two_problems())
    core = sorted(name for name in metrics if name.startswith("val-core/"))
    assert core == [
        "val-core/aime/acc/best@4/mean",
        "val-core/aime/acc/best@4/std",
        "val-core/aime/acc/maj@4/mean",
        "val-core/aime/acc/maj@4/std",
        "val-core/aime/acc/mean@4",
        "val-core/aime/acc/pass@4",
    ]
    assert "val-aux/aime/acc/best@2/mean" in metrics
    assert "val-aux/aime/reward/mean@4" in metrics
    assert not any("/pred/" in name for name in metrics)


def test_reward_is_the_core_variable_without_acc() -> None:
    sources, uids, infos = _two_problems()
    metrics = validation_metrics(sources, uids, {"reward": infos["reward"]})
    assert "val-core/aime/reward/mean@4" in metrics
    assert metrics["val-core/aime/reward/pass@4"] == 1.0
    assert not any("maj@" in name for name in metrics)


def test_results_by_source_keeps_core_means() -> None:
    metrics = validation_metrics(*_two_problems())
    assert results_by_source(metrics) == {
        "aime": {
            "mean@4": metrics["val-core/aime/acc/mean@4"],
            "best@4": metrics["val-core/aime/acc/best@4/mean"],
            "maj@4": metrics["val-core/aime/acc/maj@4/mean"],
            "pass@4": 1.0,
        }
    }


def _random_samples(seed: int, problems: int, n_per_problem: list[int] | int, sources: int = 2):
    rng = np.random.default_rng(seed)
    data_sources, uids, acc, preds = [], [], [], []
    for p in range(problems):
        n = n_per_problem if isinstance(n_per_problem, int) else n_per_problem[p % len(n_per_problem)]
        for _ in range(n):
            data_sources.append(f"src{p % sources}")
            uids.append(f"p{p}")
            acc.append(float(rng.random() < 0.4))
            preds.append(str(rng.integers(0, 4)))
    return data_sources, uids, {"reward": [2 * a - 1 for a in acc], "acc": acc, "pred": preds}


@pytest.mark.parametrize(
    ("seed", "problems", "n"),
    [
        pytest.param(0, 3, 30, id="thirty samples per problem as the AIME eval"),
        pytest.param(1, 5, 5, id="five samples, a non power of two"),
        pytest.param(2, 7, [1, 3, 8], id="problems with different sample counts"),
        pytest.param(3, 4, 1, id="one sample per problem"),
    ],
)
def test_identical_to_verls_process_validation_metrics(seed: int, problems: int, n) -> None:
    sources, uids, infos = _random_samples(seed, problems, n)
    ours = process_validation_metrics(sources, uids, infos)
    theirs = verl_process_validation_metrics(sources, uids, infos)
    assert {ds: {var: dict(m) for var, m in v.items()} for ds, v in theirs.items()} == ours


def test_bootstrap_metric_identical_to_verls() -> None:
    data = [0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.25]
    assert bootstrap_metric(data, 4, [np.max, np.mean]) == [tuple(map(float, t)) for t in verl_bootstrap_metric(data, 4, [np.max, np.mean])]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        pytest.param("val-core/aime_2024/acc/mean@30", "val-core/aime_2024/acc/mean_at_30", id="mean at k"),
        pytest.param("val-core/aime_2024/acc/maj@30/mean", "val-core/aime_2024/acc/maj_at_30/mean", id="maj at k"),
        pytest.param("val-aux/num_turns/max", "val-aux/num_turns/max", id="already valid"),
        pytest.param("timing_s/gen(ms)", "timing_s/gen_ms_", id="other invalid characters become underscores"),
    ],
)
def test_mlflow_metric_keys_are_verls_and_valid(name: str, key: str) -> None:
    assert mlflow_metric_key(name) == key
    _validate_metric_name(key)


def test_mlflow_keys_refuse_collisions() -> None:
    with pytest.raises(ValueError, match="collide"):
        to_mlflow_metrics({"a@1": 1.0, "a_at_1": 2.0})


def test_rows_from_a_csv_become_verl_inputs() -> None:
    rows = [
        {"data_source": "aime_2024", "problem": "p1", "prediction": "7", "score": "1", "acc": "True"},
        {"data_source": "aime_2024", "problem": "p1", "prediction": "3", "score": "-1", "acc": "False"},
        {"problem": "p2", "prediction": "", "score": "-1.0", "acc": "0"},
    ]
    sources, uids, infos = samples_from_rows(rows)
    assert sources == ["aime_2024", "aime_2024", "unknown"]
    assert uids == ["p1", "p1", "p2"]
    assert infos == {"reward": [1.0, -1.0, -1.0], "acc": [1.0, 0.0, 0.0], "pred": ["7", "3", ""]}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        pytest.param([{"score": 1}], "problem id column", id="no problem id"),
        pytest.param([{"uid": "a"}], "reward or score", id="no score"),
        pytest.param([{"uid": "a", "score": "high"}], "'score' must be a number", id="score not a number"),
        pytest.param([{"uid": "a", "score": 1, "acc": 1}, {"uid": "a", "score": 1}], "'acc' is set on 1 of 2 rows", id="acc on some rows only"),
    ],
)
def test_bad_rows_are_named(rows: list[dict], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        samples_from_rows(rows)


def test_rows_of_a_verl_validation_dump_group_by_prompt() -> None:
    # trainer.validation_data_dir/<step>.jsonl: input, output, gts, score, step + the reward's extra info.
    rows = [
        {"input": "user: 1+1?", "output": "\\boxed{2}", "gts": "2", "score": 1.0, "step": 0, "acc": 1.0, "pred": "2", "source": "aime_2024"},
        {"input": "user: 1+1?", "output": "\\boxed{3}", "gts": "2", "score": -1.0, "step": 0, "acc": 0.0, "pred": "3", "source": "aime_2024"},
        {"input": "user: 2+2?", "output": "\\boxed{4}", "gts": "4", "score": 1.0, "step": 0, "acc": 1.0, "pred": "4", "source": "aime_2024"},
        {"input": "user: 2+2?", "output": "\\boxed{4}", "gts": "4", "score": 1.0, "step": 0, "acc": 1.0, "pred": "4", "source": "aime_2024"},
    ]
    metrics = validation_metrics(*samples_from_rows(rows))
    assert metrics["val-core/aime_2024/acc/mean@2"] == pytest.approx(0.75)
    assert metrics["val-core/aime_2024/acc/pass@2"] == pytest.approx(1.0)
    assert metrics["val-aux/aime_2024/acc/pass@1"] == pytest.approx(0.75)
