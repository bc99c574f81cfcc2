"""Which trajectories a training step leaves out because the sandbox failed them (pure decisions).

A rollout whose interpreter call the sandbox did not run (overloaded, unreachable, a sandbox error,
or our tool's own crash: the ``sandbox_failure`` class of :mod:`retool.recipe.dynamics`) ends with
whatever reward the model then earns, most often a wrong answer. Trained on, it lowers its GRPO
group's mean, widens its std, and pushes the policy away from the tool for a fault that was never
the model's. Under Spot preemption or a sandbox outage that is 5-15 % of episodes (allenai/open-instruct
measured it and masks them too). verl has no notion of it, so the step decides here:

- **failed**: a trajectory with at least one call in the ``sandbox_failure`` class. A timeout is the
  model's (its code ran too long) and stays in.
- **orphaned**: the last trajectory of a group that had two or more and kept one. GRPO's baseline is
  the group's other answers; verl gives a group of one mean 0 and std 1
  (``compute_grpo_outcome_advantage``, ``verl/trainer/ppo/core_algos.py``, 0.6.1 and 0.9.1), so its
  advantage would be its raw reward, a signal no other trajectory of the step gets. A group that had
  one trajectory to begin with (``rollout.n`` 1) keeps verl's rule.

The masked share is ``(failed + orphaned) / n``; above ``rl.maxSandboxFailureShare`` the step raises
:class:`SandboxOutageError` instead of training on what is left (the stage fails, and its
retry resumes from the last checkpoint once the sandbox is back). How the decision is applied to
verl's batch is :mod:`retool.recipe.verl_plugins.masking`.

>>> from retool.recipe.dynamics import tool_record
>>> ok, down = tool_record(["ok"], [1], 0), tool_record(["unavailable"], [1], 0)
>>> decision = decide_mask([ok, down, ok, down], ["a", "a", "b", "b"])
>>> decision.failed.tolist(), decision.orphaned.tolist(), decision.metrics()["tool/masked_ratio"]
([False, True, False, True], [True, False, True, False], 1.0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retool.recipe.dynamics import TRAIN_PREFIX, outcome_class


class SandboxOutageError(RuntimeError):
    """More of a step's trajectories were hit by sandbox failures than ``rl.maxSandboxFailureShare`` allows.

    ``metrics`` are the step's masking figures, logged before the step fails so the chart shows the outage.
    """

    def __init__(self, message: str, metrics: dict[str, float]) -> None:
        super().__init__(message)
        self.metrics = metrics


def _outcomes(record: Any) -> Sequence[str]:
    return record.get("outcomes", ()) if isinstance(record, Mapping) else ()


def sandbox_failed(records: Sequence[Any]) -> np.ndarray:
    """Per trajectory: did any of its calls end in the ``sandbox_failure`` class (records of :func:`retool.recipe.dynamics.tool_record`)."""
    return np.fromiter((any(outcome_class(o) == "sandbox_failure" for o in _outcomes(r)) for r in records), dtype=bool, count=len(records))


@dataclass(frozen=True)
class MaskDecision:
    failed: np.ndarray
    """Trajectories with a call the sandbox did not run."""
    orphaned: np.ndarray
    """The lone survivors of groups of two or more."""
    failures: Counter[str]
    """The failed calls by outcome name (``overloaded``, ``unavailable``...), for the error message."""

    @property
    def masked(self) -> np.ndarray:
        return self.failed | self.orphaned

    @property
    def share(self) -> float:
        n = len(self.failed)
        return float(self.masked.sum()) / n if n else 0.0

    def metrics(self, prefix: str = TRAIN_PREFIX) -> dict[str, float]:
        """The step's figures: logged every step, 0 when nothing was masked, so a chart shows the outage's start and end."""
        p = prefix.rstrip("/")
        return {
            f"{p}/masked_sandbox_failure_count": float(self.failed.sum()),
            f"{p}/masked_orphaned_count": float(self.orphaned.sum()),
            f"{p}/masked_ratio": self.share,
        }


def decide_mask(records: Sequence[Any], groups: Sequence[Any]) -> MaskDecision:
    """The trajectories to leave out of a step, given each one's record and its GRPO group (verl's ``uid``)."""
    if len(records) != len(groups):
        raise ValueError(f"{len(records)} records but {len(groups)} group ids: one of each per trajectory")
    failed = sandbox_failed(records)
    sizes = Counter(groups)
    kept = Counter(g for g, f in zip(groups, failed, strict=True) if not f)
    orphaned = np.fromiter((not f and sizes[g] >= 2 and kept[g] == 1 for g, f in zip(groups, failed, strict=True)), dtype=bool, count=len(groups))
    failures = Counter(o for r in records for o in _outcomes(r) if outcome_class(o) == "sandbox_failure")
    return MaskDecision(failed=failed, orphaned=orphaned, failures=failures)


def check_share(decision: MaskDecision, max_share: float, *, step: int) -> None:
    """Raise :class:`SandboxOutageError` when the step would leave out more than ``max_share`` of its trajectories."""
    if decision.share <= max_share:
        return
    n = len(decision.failed)
    causes = ", ".join(f"{name} {count}" for name, count in sorted(decision.failures.items()))
    raise SandboxOutageError(
        f"step {step}: {int(decision.failed.sum())} of {n} trajectories had an interpreter call the sandbox did not run ({causes} calls)"
        f" and {int(decision.orphaned.sum())} more were left alone in their group: {decision.share:.1%} would be left out, above"
        f" spec.rl.maxSandboxFailureShare {max_share:.1%}. Not training on this batch; check the run's sandbox"
        " (kubectl get pods -l retool.dev/component=sandbox) and its Service, then let the stage retry from its last checkpoint.",
        decision.metrics(),
    )
