"""What the trainer does with each scored batch: tool-use dynamics, reward-hacking signals, the second verifier.

On the training path (:meth:`BatchWatcher.observe`) only array work happens: the agent loop's
records, the scores and the response lengths reduced to metrics (well under a second for 512 x 16
responses, see bench/RESULTS.md), and the few sampled rows copied out. Everything slow runs on one
background thread: decoding the sampled responses, math-verify in a separate process (it bounds its
work with ``SIGALRM``, which only a main thread can use), and the MLflow writes.

Where the training figures go: verl's MLflow logger starts the stage's run in this process
(``mlflow.start_run``, resuming ``MLFLOW_RUN_ID``); the watcher writes to that run at the trainer's
step with its own client. Without MLflow in ``trainer.logger`` they go to the log.
The ``RewardSuspect`` state is the stage run's tag ``retool.rewardSuspect`` (a message while
suspect, empty once cleared): the operator copies it into the RetoolRun's conditions.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retool.recipe.dynamics import RECORD_KEY, TRAIN_PREFIX, VALIDATION_PREFIX, reduce_dynamics
from retool.recipe.reward_watch import WATCH_PREFIX, SuspectTracker, WatchSettings, count_boxed, disagreement_metrics, hacking_signals, sample_rows, second_verdict

logger = logging.getLogger(__name__)

CONFIG_KEY = "retool"
"""Our own keys in verl's Hydra config (rendered as ``+retool.reward_watch.share=...``)."""
SUSPECT_TAG = "retool.rewardSuspect"
"""Read by the operator (``retool.tracking.reward_suspect``) into the RewardSuspect condition."""
TABLE_DIR = "reward-watch"
TAIL_CHARS = 600
VERIFY_TIMEOUT_S = 120.0


@dataclass
class ScoredBatch:
    """The per-response columns of one scored batch that the figures need (all numpy, one row per response)."""

    records: list[Any]
    correct: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    preds: list[Any] | None

    @classmethod
    def concat(cls, parts: list[ScoredBatch]) -> ScoredBatch:
        preds = None if any(p.preds is None for p in parts) else [x for p in parts for x in p.preds or []]
        return cls(
            records=[r for p in parts for r in p.records],
            correct=np.concatenate([p.correct for p in parts]) if parts else np.zeros(0, bool),
            lengths=np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0),
            truncated=np.concatenate([p.truncated for p in parts]) if parts else np.zeros(0, bool),
            preds=preds,
        )


def _column(data: Any, extra: Mapping[str, Any], key: str) -> Any:
    value = extra.get(key) if extra else None
    return data.non_tensor_batch.get(key) if value is None else value


def scored_batch(data: Any, scores: Any, extra: Mapping[str, Any], response_length: int) -> ScoredBatch:
    """The columns of a verl ``DataProto`` scored by a reward manager (``scores``: the reward tensor).

    The batch's tensors are 8192 x 16k tokens at the recipe's size, and one pass over one of them
    costs a few tenths of a second; so lengths come from the agent loop's records and correctness
    from the reward's ``acc`` when they are there, and the tensors are read only when they are not.
    """
    n = len(data)
    column = data.non_tensor_batch.get(RECORD_KEY)
    records = list(column) if column is not None else [None] * n
    recorded = np.fromiter((r.get("response_tokens", -1) if isinstance(r, Mapping) else -1 for r in records), dtype=np.int64, count=n)
    if (recorded >= 0).all():
        lengths = recorded
    else:
        prompt_length = data.batch["prompts"].shape[1]
        lengths = data.batch["attention_mask"][:, prompt_length:].sum(-1).cpu().numpy()
    acc = _column(data, extra, "acc")
    correct = np.asarray(acc, dtype=np.float64) > 0.5 if acc is not None and len(acc) == n else scores.sum(-1).cpu().numpy() > 0
    preds = _column(data, extra, "pred")
    return ScoredBatch(records=records, correct=correct, lengths=lengths, truncated=lengths >= response_length, preds=None if preds is None else list(preds))


@dataclass
class Sample:
    """One re-graded response, as it goes to the table."""

    row: int
    problem: str
    answer: str
    response: str
    reward_correct: bool
    pred: str = ""
    verifier_correct: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _problem(data: Any, row: int) -> str:
    info = data.non_tensor_batch.get("extra_info")
    if info is not None and isinstance(info[row], Mapping) and info[row].get("question"):
        return str(info[row]["question"])
    return ""


def _truth(data: Any, row: int) -> str:
    reward_model = data.non_tensor_batch.get("reward_model")
    if reward_model is not None and isinstance(reward_model[row], Mapping):
        return str(reward_model[row].get("ground_truth", ""))
    return ""


class MlflowTarget:
    """The MLflow run the trainer's metrics go to, resolved on the trainer's thread (the fluent active run is per thread)."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id

    @classmethod
    def current(cls) -> MlflowTarget | None:
        import mlflow

        run = mlflow.active_run()
        run_id = run.info.run_id if run is not None else os.environ.get("MLFLOW_RUN_ID")
        if not run_id:
            return None
        return cls(mlflow.get_tracking_uri(), run_id)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Metric

        from retool.recipe.metrics import mlflow_metric_key

        client = MlflowClient(self.tracking_uri)
        now = int(__import__("time").time() * 1000)
        items = [Metric(mlflow_metric_key(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_table(self, columns: Mapping[str, list[Any]], artifact_file: str) -> None:
        from mlflow import MlflowClient

        MlflowClient(self.tracking_uri).log_table(self.run_id, data=dict(columns), artifact_file=artifact_file)

    def set_tag(self, key: str, value: str) -> None:
        from mlflow import MlflowClient

        MlflowClient(self.tracking_uri).set_tag(self.run_id, key, value)

    def tags(self) -> dict[str, str]:
        from mlflow import MlflowClient

        return dict(MlflowClient(self.tracking_uri).get_run(self.run_id).data.tags)


class BatchWatcher:
    """Collects the figures of each scored batch; see the module docstring for what runs where."""

    def __init__(self, *, tokenizer: Any, response_length: int, settings: WatchSettings, use_mlflow: bool) -> None:
        self.tokenizer = tokenizer
        self.response_length = int(response_length)
        self.settings = settings
        self.use_mlflow = use_mlflow
        self.tracker = SuspectTracker(settings)
        self._validation: list[ScoredBatch] | None = None
        self._background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="retool-watch")
        self._verifier: concurrent.futures.ProcessPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[Any]] = []

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> BatchWatcher:
        ours = config.get(CONFIG_KEY) or {}
        watch = dict(ours.get("reward_watch") or {})
        loggers = config.trainer.get("logger") or []
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        return cls(
            tokenizer=tokenizer,
            response_length=config.actor_rollout_ref.rollout.response_length,
            settings=WatchSettings(**watch),
            use_mlflow="mlflow" in loggers,
        )

    # -- the trainer's side --------------------------------------------------------------------

    def observe(self, data: Any, scores: Any, extra: Mapping[str, Any], *, step: int, validate: bool, also: Mapping[str, float] | None = None) -> dict[str, float]:
        """Account for one scored batch; returns the training step's metrics (empty while validating).

        ``also``: the step's other figures to log with them (the masking of sandbox failures)."""
        scored = scored_batch(data, scores, extra, self.response_length)
        if validate:
            if self._validation is not None:
                self._validation.append(scored)
            return {}
        metrics = {**reduce_dynamics(scored.records, scored.correct, scored.lengths, TRAIN_PREFIX), **(also or {})}
        metrics.update(hacking_signals(scored.records, scored.correct, scored.preds, scored.truncated))
        target = MlflowTarget.current() if self.use_mlflow else None
        samples = self._samples(data, scored, step) if self.settings.enabled else []
        self._submit(self._after_step, metrics, samples, step, target)
        return metrics

    def start_validation(self) -> None:
        self._validation = []

    def finish_validation(self, *, step: int) -> dict[str, float]:
        parts, self._validation = self._validation or [], None
        if not parts:
            return {}
        scored = ScoredBatch.concat(parts)
        metrics = reduce_dynamics(scored.records, scored.correct, scored.lengths, VALIDATION_PREFIX)
        metrics.update(hacking_signals(scored.records, scored.correct, scored.preds, scored.truncated, prefix=f"val-{WATCH_PREFIX}"))
        return metrics

    def _samples(self, data: Any, scored: ScoredBatch, step: int) -> list[Sample]:
        rows = sample_rows(len(scored.records), self.settings, step)
        if not rows.size:
            return []
        responses = data.batch["responses"][rows].cpu().numpy()
        lengths = scored.lengths[rows]
        return [
            Sample(
                row=int(row),
                problem=_problem(data, int(row)),
                answer=_truth(data, int(row)),
                response=responses[i][: int(lengths[i])].tolist(),  # decoded off the training path
                reward_correct=bool(scored.correct[row]),
                pred=str(scored.preds[row]) if scored.preds is not None else "",
            )
            for i, row in enumerate(rows)
        ]

    def _submit(self, fn: Any, *args: Any) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._background.submit(fn, *args))

    # -- the background thread -------------------------------------------------------------------

    def _after_step(self, metrics: dict[str, float], samples: list[Sample], step: int, target: MlflowTarget | None) -> None:
        try:
            watch_metrics, table = self.verify(samples)
            metrics = {**metrics, **watch_metrics}
            verified = int(watch_metrics.get(f"{WATCH_PREFIX}/verified", 0))
            disagreed = round(watch_metrics.get(f"{WATCH_PREFIX}/disagreement_rate", 0.0) * verified)
            message = self.tracker.update(step, disagreed, verified)
            if verified:
                metrics[f"{WATCH_PREFIX}/cusum"] = self.tracker.statistic
            if target is None:
                logger.info("step %d tool-use dynamics: %s", step, metrics)
                if message:
                    logger.warning("RewardSuspect: %s", message)
                return
            target.log_metrics(metrics, step)
            if table:
                target.log_table(table, f"{TABLE_DIR}/step_{step:06d}.json")
            if message is not None:
                target.set_tag(SUSPECT_TAG, message)
        except Exception:
            logger.exception("step %d: the tool-use dynamics and reward watch could not be logged", step)

    def verify(self, samples: list[Sample]) -> tuple[dict[str, float], dict[str, list[Any]]]:
        """Decode, re-grade and compare ``samples``; the metrics and the disagreement table's columns."""
        if not samples:
            return {}, {}
        for sample in samples:
            if not isinstance(sample.response, str):
                sample.response = self.tokenizer.decode(sample.response, skip_special_tokens=True)
        verdicts = self._verdicts([(s.response, s.answer) for s in samples])
        for sample, verdict in zip(samples, verdicts, strict=True):
            sample.verifier_correct = verdict
        graded = [s for s in samples if s.verifier_correct is not None]
        metrics = disagreement_metrics([s.reward_correct for s in graded], [bool(s.verifier_correct) for s in graded])
        metrics[f"{WATCH_PREFIX}/unknown"] = float(len(samples) - len(graded)) / len(samples)
        metrics[f"{WATCH_PREFIX}/several_boxed"] = float(np.mean([count_boxed(s.response) > 1 for s in samples]))
        differing = [s for s in graded if s.reward_correct != s.verifier_correct]
        table = {
            "row": [s.row for s in differing],
            "problem": [s.problem for s in differing],
            "answer": [s.answer for s in differing],
            "reward_pred": [s.pred for s in differing],
            "response_tail": [s.response[-TAIL_CHARS:] for s in differing],
            "reward_correct": [s.reward_correct for s in differing],
            "verifier_correct": [bool(s.verifier_correct) for s in differing],
        }
        return metrics, (table if differing else {})

    def _verdicts(self, pairs: list[tuple[str, str]]) -> list[bool | None]:
        if self._verifier is None:
            self._verifier = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        futures = [self._verifier.submit(second_verdict, response, truth) for response, truth in pairs]
        verdicts: list[bool | None] = []
        for future in futures:
            try:
                verdict = future.result(timeout=VERIFY_TIMEOUT_S)
                verdicts.append(None if verdict == "unknown" else verdict == "correct")  # unknown is no verdict, never a disagreement
            except Exception:  # a verdict that cannot be had is left out of the rates
                logger.warning("the second verifier could not grade a sample", exc_info=True)
                verdicts.append(None)
        return verdicts

    def flush(self, timeout: float | None = None) -> None:
        """Wait for the background work submitted so far (tests, and the end of training)."""
        concurrent.futures.wait(self._pending, timeout=timeout)
        self._pending = []

    def close(self) -> None:
        self.flush(timeout=600)
        self._background.shutdown(wait=True)
        if self._verifier is not None:
            self._verifier.shutdown(wait=True, cancel_futures=True)
