"""Evaluation metrics from per-sample results, computed and named exactly as verl 0.6.1 does.

verl's trainer (``RayPPOTrainer._validate`` and ``verl.trainer.ppo.metric_utils``) reports
``val-core/<data_source>/<var>/mean@N``, ``.../maj@N/mean`` and ``.../best@N/mean`` where the
best-of and majority-of values are bootstrap estimates: for every problem (uid), 1000 subsets of
size n are drawn with replacement from a generator re-seeded with 42 for each (problem, n). The
numbers logged during RL validation and the numbers the eval stage reports must agree, so this
module reproduces that computation bit for bit (a test compares it with verl's own function) —
without importing verl, so the operator and the CLI can use it too. It uses a private
``RandomState`` instead of verl's global ``np.random.seed`` (same stream, no side effect) and
vectorises the bootstrap.

On top of verl's metrics it adds ``pass@k`` with the unbiased estimator of Chen et al. (2021),
``1 - C(n-c, k) / C(n, k)`` averaged over problems, which verl does not report; best@k is its
biased bootstrap cousin.

MLflow rejects ``@`` in metric keys; :func:`mlflow_metric_key` applies the same sanitisation as
verl's MLflow logger, so the keys written here and by the trainer line up in the MLflow UI.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

VERL_SEED = 42
"""verl's default bootstrap seed (process_validation_metrics(seed=42))."""

N_BOOTSTRAP = 1000
"""verl's bootstrap_metric default number of resamples."""

CORE_PREFIXES = ("mean", "maj", "best", "pass")
"""Metric names promoted to val-core (at the largest n). verl promotes mean/maj/best; pass is ours."""

_MLFLOW_INVALID_CHARS = re.compile(r"[^/\w.\- :]")

Metrics = dict[str, float]


def bootstrap_metric(
    data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Any], n_bootstrap: int = N_BOOTSTRAP, seed: int = VERL_SEED
) -> list[tuple[float, float]]:
    """verl's ``bootstrap_metric`` for arbitrary reducers (mean and std of each reducer over resamples).

    Kept for parity with verl's signature; the metric code below uses the vectorised versions.
    """
    indices = _bootstrap_indices(len(data), subset_size, n_bootstrap, seed)
    results = []
    for reduce_fn in reduce_fns:
        values = [reduce_fn([data[i] for i in row]) for row in indices]
        results.append((float(np.mean(values)), float(np.std(values))))
    return results


def _bootstrap_indices(population: int, subset_size: int, n_bootstrap: int, seed: int) -> np.ndarray:
    # One draw of shape (n_bootstrap, subset_size) consumes the Mersenne Twister stream exactly like
    # verl's n_bootstrap successive np.random.choice(population, size=subset_size) calls.
    return np.random.RandomState(seed).choice(population, size=(n_bootstrap, subset_size), replace=True)


def majority_values(values: np.ndarray, vote_codes: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """verl's ``calc_maj_val`` for every bootstrap row at once.

    In each row the most frequent vote wins; ties go to the vote seen first in the row (verl
    takes ``max`` over an insertion-ordered dict), and the row's value is that of the first
    sample carrying the winning vote. The first position whose vote has the row's top count is
    exactly that sample, so an argmax over "count == top count" finds it.
    """
    votes = vote_codes[indices]
    counts = (votes[:, :, None] == votes[:, None, :]).sum(axis=2)
    first_winner = np.argmax(counts == counts.max(axis=1, keepdims=True), axis=1)
    return values[indices[np.arange(len(indices)), first_winner]]


def bootstrap_sizes(n_responses: int) -> list[int]:
    """Subset sizes verl bootstraps: powers of two below n, then n itself (30 -> 2, 4, 8, 16, 30)."""
    sizes = []
    n = 2
    while n < n_responses:
        sizes.append(n)
        n *= 2
    sizes.append(n_responses)
    return sizes


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples: 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(5, 2, 2)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    0.7
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form avoids huge binomials: C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i).
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _is_numeric_var(values: Sequence[Any]) -> bool:
    # verl skips a variable when its first value is a string (the "pred" answers); None values
    # (no answer extracted) are not numbers either and would crash np.mean.
    return not any(v is None or isinstance(v, str) for v in values)


def _problem_metrics(values: np.ndarray, votes: Sequence[Hashable] | None, seed: int) -> Metrics:
    metric: Metrics = {}
    n_resps = len(values)
    metric[f"mean@{n_resps}"] = float(np.mean(values))
    if n_resps <= 1:
        return metric
    metric[f"std@{n_resps}"] = float(np.std(values))
    vote_codes = None
    if votes is not None:
        codes: dict[Hashable, int] = {}
        vote_codes = np.array([codes.setdefault(v, len(codes)) for v in votes])
    for n in bootstrap_sizes(n_resps):
        indices = _bootstrap_indices(n_resps, n, N_BOOTSTRAP, seed)
        resampled = values[indices]
        best, worst = resampled.max(axis=1), resampled.min(axis=1)
        metric[f"best@{n}/mean"], metric[f"best@{n}/std"] = float(np.mean(best)), float(np.std(best))
        metric[f"worst@{n}/mean"], metric[f"worst@{n}/std"] = float(np.mean(worst)), float(np.std(worst))
        if vote_codes is not None:
            majority = majority_values(values, vote_codes, indices)
            metric[f"maj@{n}/mean"], metric[f"maj@{n}/std"] = float(np.mean(majority)), float(np.std(majority))
    return metric


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Hashable], infos_dict: Mapping[str, Sequence[Any]], seed: int = VERL_SEED
) -> dict[str, dict[str, Metrics]]:
    """verl's ``process_validation_metrics``: {data_source: {var: {metric: mean over problems}}}.

    ``infos_dict`` maps a variable name (``reward``, ``acc``, ``pred``, ...) to one value per
    sample; samples of one problem share a uid. A ``pred`` variable enables majority voting.
    """
    for name, values in infos_dict.items():
        if len(values) != len(data_sources):
            raise ValueError(f"variable {name!r} has {len(values)} values for {len(data_sources)} samples")
    if len(sample_uids) != len(data_sources):
        raise ValueError(f"{len(sample_uids)} uids for {len(data_sources)} samples")

    grouped: dict[str, dict[Hashable, dict[str, list[Any]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for index, data_source in enumerate(data_sources):
        var2vals = grouped[data_source][sample_uids[index]]
        for var_name, values in infos_dict.items():
            var2vals[var_name].append(values[index])

    collected: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for data_source, uid2vars in grouped.items():
        for var2vals in uid2vars.values():
            votes = var2vals.get("pred")
            for var_name, values in var2vals.items():
                if not _is_numeric_var(values):
                    continue
                metric = _problem_metrics(np.asarray(values, dtype=float), votes, seed)
                for metric_name, value in metric.items():
                    collected[data_source][var_name][metric_name].append(value)

    return {
        data_source: {var: {name: float(np.mean(vals)) for name, vals in metrics.items()} for var, metrics in var2metrics.items()}
        for data_source, var2metrics in collected.items()
    }


def pass_at_k_metrics(sample_uids: Sequence[Hashable], values: Sequence[Any]) -> Metrics:
    """Mean over problems of the unbiased pass@k, for k = 1 and verl's bootstrap sizes.

    A sample counts as solved when its value is > 0 (acc 1/0 or the paper's +1/-1 reward).
    Problems with fewer samples than k do not contribute to pass@k.
    """
    per_uid: dict[Hashable, list[bool]] = defaultdict(list)
    for uid, value in zip(sample_uids, values, strict=True):
        per_uid[uid].append(float(value) > 0)
    collected: dict[str, list[float]] = defaultdict(list)
    for solved in per_uid.values():
        n, c = len(solved), sum(solved)
        for k in [1, *bootstrap_sizes(n)] if n > 1 else [1]:
            collected[f"pass@{k}"].append(pass_at_k(n, c, k))
    return {name: float(np.mean(vals)) for name, vals in collected.items()}


def _largest_n(metric_names: Iterable[str]) -> int:
    return max(int(name.split("@")[-1].split("/")[0]) for name in metric_names)


def validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Hashable], infos_dict: Mapping[str, Sequence[Any]], seed: int = VERL_SEED, with_pass_at_k: bool = True
) -> Metrics:
    """Flat metric dict named as verl's trainer names it: ``val-core/aime_2024/acc/mean@30``.

    The core variable is ``acc`` when present, else ``reward``; its mean/maj/best metrics at the
    largest n go to ``val-core``, everything else to ``val-aux`` (verl's rule). ``pass@k`` of
    the core variable follows the same rule.
    """
    nested = process_validation_metrics(data_sources, sample_uids, infos_dict, seed=seed)
    metrics: Metrics = {}
    for data_source, var2metrics in nested.items():
        core_var = "acc" if "acc" in var2metrics else "reward"
        var2metrics = {var: dict(m) for var, m in var2metrics.items()}
        if with_pass_at_k and core_var in var2metrics:
            selected = [i for i, ds in enumerate(data_sources) if ds == data_source]
            var2metrics[core_var].update(pass_at_k_metrics([sample_uids[i] for i in selected], [infos_dict[core_var][i] for i in selected]))
        for var_name, metric2val in var2metrics.items():
            n_max = _largest_n(metric2val)
            for metric_name, value in metric2val.items():
                core = var_name == core_var and metric_name.startswith(CORE_PREFIXES) and f"@{n_max}" in metric_name
                metrics[f"{'val-core' if core else 'val-aux'}/{data_source}/{var_name}/{metric_name}"] = value
    return metrics


def samples_from_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str], dict[str, list[Any]]]:
    """Turn per-sample result rows into verl's (data_sources, uids, infos_dict).

    Columns: ``data_source``, else ``source`` (what the reward echoes into verl's validation dump),
    default ``unknown`` as verl; the problem id from ``uid``, else
    ``problem``, else ``input`` (verl's validation dump has only the prompt text); ``reward``
    or ``score`` (required); optional ``acc``; the extracted answer from ``pred`` or
    ``prediction`` (enables maj@k). CSV strings are parsed as numbers.
    """
    data_sources: list[str] = []
    uids: list[str] = []
    infos: dict[str, list[Any]] = defaultdict(list)
    for number, row in enumerate(rows, start=1):
        uid_key = next((k for k in ("uid", "problem", "input") if row.get(k) not in (None, "")), None)
        if uid_key is None:
            raise ValueError(f"row {number}: needs a problem id column (uid, problem or input)")
        reward_key = next((k for k in ("reward", "score") if row.get(k) not in (None, "")), None)
        if reward_key is None:
            raise ValueError(f"row {number}: needs a reward or score column")
        data_sources.append(str(row.get("data_source") or row.get("source") or "unknown"))
        uids.append(str(row[uid_key]))
        infos["reward"].append(_number(row[reward_key], number, reward_key))
        if row.get("acc") not in (None, ""):
            infos["acc"].append(_number(row["acc"], number, "acc"))
        pred_key = next((k for k in ("pred", "prediction") if k in row), None)
        if pred_key is not None:
            pred = row[pred_key]
            infos["pred"].append("" if pred is None else str(pred))
    for name, values in infos.items():
        if len(values) != len(uids):
            raise ValueError(f"column {name!r} is set on {len(values)} of {len(uids)} rows; set it on every row or none")
    return data_sources, uids, dict(infos)


def _number(value: Any, row: int, column: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return 1.0 if value.strip().lower() == "true" else 0.0
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"row {row}: column {column!r} must be a number, got {value!r}") from None
    if math.isnan(number):
        raise ValueError(f"row {row}: column {column!r} is NaN")
    return number


def mlflow_metric_key(name: str) -> str:
    """The key MLflow stores for a verl metric name, as verl's MLflow logger sanitises it.

    MLflow 3 rejects ``@`` (keys may hold only alphanumerics, ``_ - . / :`` and spaces), so
    ``@`` becomes ``_at_`` and any other invalid character ``_``:
    ``val-core/aime_2024/acc/mean@30`` -> ``val-core/aime_2024/acc/mean_at_30``.
    """
    return _MLFLOW_INVALID_CHARS.sub("_", name.replace("@", "_at_"))


def to_mlflow_metrics(metrics: Mapping[str, float]) -> Metrics:
    """Sanitised keys; refuses two names that would collide after sanitising."""
    result: Metrics = {}
    for name, value in metrics.items():
        key = mlflow_metric_key(name)
        if key in result:
            raise ValueError(f"metric names collide in MLflow as {key!r}")
        result[key] = float(value)
    return result


def results_by_source(metrics: Mapping[str, float]) -> dict[str, Metrics]:
    """The val-core metrics per data source, short-named: {aime_2024: {mean@30: .., maj@30: .., best@30: .., pass@30: ..}}.

    This is what the operator writes to status.results and the registry puts on the model version.
    """
    results: dict[str, Metrics] = defaultdict(dict)
    for name, value in metrics.items():
        parts = name.split("/")
        if parts[0] != "val-core" or len(parts) < 4:
            continue
        data_source, metric = parts[1], "/".join(parts[3:])
        if metric.endswith("/std"):
            continue
        results[data_source][metric.removesuffix("/mean")] = float(value)
    return dict(results)
