"""What an operator with given settings refuses in a run that is valid on its own.

A RetoolRun can be valid (``retool.spec.rules``) and still be refused by the operator it is sent
to: gang scheduling needs the batch scheduler KubeRay runs with, Kueue cannot sit in front of
one, and the chart caps the sandbox replicas of one run. These rules depend on the operator's
settings, not on the spec alone, so they live here as pure functions of (run, settings): the
operator applies them at admission and before creating children, and ``retool validate`` /
``retool render`` apply them offline with the settings the user names (``--batch-scheduler``,
``--sandbox-max-replicas`` or the operator's own ``RETOOL_OPERATOR_*`` variables), so a file the
CLI calls valid is one the operator accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from retool.spec.model import MAX_SANDBOX_REPLICAS, RetoolRun
from retool.spec.problem import Problem
from retool.spec.rules import sandbox_replica_problem

BATCH_SCHEDULERS = ("", "volcano", "yunikorn")
"""KubeRay's batch schedulers (its --batch-scheduler) the operator builds labels for; "" = none."""

DEFAULT_SANDBOX_MAX_REPLICAS = 256
"""The chart's limits.sandboxReplicas default (the operator's sandbox_max_replicas)."""

BATCH_SCHEDULER_ENV = "RETOOL_OPERATOR_BATCH_SCHEDULER"
SANDBOX_MAX_REPLICAS_ENV = "RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS"


@dataclass(frozen=True)
class OperatorSettings:
    """The operator settings a run's admission depends on (defaults: the chart's)."""

    batch_scheduler: str = ""
    sandbox_max_replicas: int = DEFAULT_SANDBOX_MAX_REPLICAS

    def __post_init__(self) -> None:
        if self.batch_scheduler not in BATCH_SCHEDULERS:
            raise ValueError(f"batch scheduler {self.batch_scheduler!r} is not one of none, {', '.join(BATCH_SCHEDULERS[1:])}")
        if not 1 <= self.sandbox_max_replicas <= MAX_SANDBOX_REPLICAS:
            raise ValueError(f"sandbox max replicas {self.sandbox_max_replicas} is not within 1..{MAX_SANDBOX_REPLICAS}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """The settings from the operator's own variables (as the chart sets them); ValueError naming a bad one."""
        scheduler = environ.get(BATCH_SCHEDULER_ENV, "")
        replicas_text = environ.get(SANDBOX_MAX_REPLICAS_ENV, "")
        try:
            replicas = int(replicas_text) if replicas_text else DEFAULT_SANDBOX_MAX_REPLICAS
        except ValueError:
            raise ValueError(f"{SANDBOX_MAX_REPLICAS_ENV}={replicas_text!r} is not an integer") from None
        try:
            return cls(batch_scheduler=scheduler, sandbox_max_replicas=replicas)
        except ValueError as err:
            raise ValueError(f"{BATCH_SCHEDULER_ENV} / {SANDBOX_MAX_REPLICAS_ENV}: {err}") from None


def scheduling_refusals(run: RetoolRun, batch_scheduler: str) -> list[Problem]:
    """What an operator whose KubeRay runs ``batch_scheduler`` ("" = none) cannot do for the run's scheduling."""
    scheduling = run.spec.scheduling
    problems = []
    if scheduling.gang.enabled and not batch_scheduler:
        problems.append(
            Problem(
                "spec.scheduling.gang.enabled",
                "this operator knows no batch scheduler (chart value defaults.batchScheduler, which must match KubeRay's "
                "--batch-scheduler); without one the Ray pods would start one by one. Ask the cluster administrator, or set gang.enabled: false",
            )
        )
    if scheduling.queue_name and batch_scheduler:
        problems.append(
            Problem(
                "spec.scheduling.queueName",
                f"KubeRay on this cluster hands RayJobs to {batch_scheduler} (chart value defaults.batchScheduler); "
                "Kueue in front of it would queue every stage twice. Use spec.scheduling.gang instead",
            )
        )
    return problems


def operator_refusals(run: RetoolRun, settings: OperatorSettings) -> list[Problem]:
    """Every reason an operator with ``settings`` refuses a valid run (empty = it accepts it)."""
    problems = scheduling_refusals(run, settings.batch_scheduler)
    too_many = sandbox_replica_problem(run.spec, settings.sandbox_max_replicas, "sandboxMaxReplicas")
    return [*problems, *([too_many] if too_many is not None else [])]
