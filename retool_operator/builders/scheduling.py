"""How a stage's child joins the cluster's scheduling: a Kueue queue, or KubeRay's batch scheduler.

Kueue (``spec.scheduling.queueName``): every Job and RayJob carries the
``kueue.x-k8s.io/queue-name`` label and is created with ``spec.suspend: true``. Kueue owns
``suspend`` from then on: it sets it to false when it admits the workload and back to true when it
preempts it (its job reconciler also re-starts an admitted workload whose job is suspended by
anyone else, so the operator never touches ``suspend`` of a queued child; a run's own
``spec.suspend`` deactivates the child's Kueue Workload instead, see ``reconcile``). Kueue takes
the workload's priority from the pods' ``priorityClassName``, or from a WorkloadPriorityClass
named by the ``kueue.x-k8s.io/priority-class`` label.

Gang scheduling (``spec.scheduling.gang``): KubeRay 1.7 runs one batch scheduler for the whole
cluster (its ``--batch-scheduler``, the operator's ``batchScheduler`` setting says which) and
reads these RayJob labels, which it copies to the RayCluster and its pods:

- volcano: every RayJob gets a PodGroup (minMember = head + workers, minResources = their sum);
  ``volcano.sh/queue-name`` picks the Volcano queue, ``ray.io/priority-class-name`` the
  PodGroup's priority;
- yunikorn: gang scheduling is opt-in per RayJob with ``ray.io/gang-scheduling-enabled``; the
  application id is ``yunikorn.apache.org/app-id`` (the RayJob's name: unique per attempt) and
  the queue ``yunikorn.apache.org/queue``.

Batch Jobs (prepare, merge) are single pods: nothing to gang, so they keep the default scheduler.
"""

from __future__ import annotations

from retool.spec.model import RetoolRun
from retool.spec.operator_rules import scheduling_refusals
from retool_operator.config import OperatorConfig

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
VOLCANO_QUEUE_LABEL = "volcano.sh/queue-name"
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
RAY_GANG_LABEL = "ray.io/gang-scheduling-enabled"
YUNIKORN_APP_LABEL = "yunikorn.apache.org/app-id"
YUNIKORN_QUEUE_LABEL = "yunikorn.apache.org/queue"


def queued(run: RetoolRun) -> bool:
    """Whether the run's children are admitted by Kueue (created suspended, suspend owned by Kueue)."""
    return bool(run.spec.scheduling.queue_name)


def scheduling_labels(run: RetoolRun, config: OperatorConfig, *, child_name: str, ray: bool) -> dict[str, str]:
    """Labels of a stage's Job (``ray=False``) or RayJob that hand it to the cluster's scheduling."""
    scheduling = run.spec.scheduling
    out: dict[str, str] = {}
    if scheduling.queue_name:
        out[KUEUE_QUEUE_LABEL] = scheduling.queue_name
        if scheduling.workload_priority_class_name:
            out[KUEUE_PRIORITY_LABEL] = scheduling.workload_priority_class_name
    if ray and scheduling.gang.enabled:
        if config.batch_scheduler == "volcano":
            if scheduling.gang.queue:
                out[VOLCANO_QUEUE_LABEL] = scheduling.gang.queue
            if scheduling.priority_class_name:
                out[RAY_PRIORITY_LABEL] = scheduling.priority_class_name
        elif config.batch_scheduler == "yunikorn":
            out[RAY_GANG_LABEL] = "true"
            out[YUNIKORN_APP_LABEL] = child_name
            if scheduling.gang.queue:
                out[YUNIKORN_QUEUE_LABEL] = scheduling.gang.queue
    return out


def scheduling_problems(run: RetoolRun, config: OperatorConfig) -> list[str]:
    """What this operator cannot do for the run's scheduling (the spec alone is valid); the rule is
    ``retool.spec.operator_rules``, which ``retool validate`` applies offline too."""
    return [str(p) for p in scheduling_refusals(run, config.batch_scheduler)]
