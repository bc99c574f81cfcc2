"""How many sandbox replicas the run wants this pass (pure; the one home of the rule).

Replicas = ceil(maxConcurrent / perReplicaConcurrency) only while the current stage calls the
sandbox (preflight, rl, eval) *and runs*: a stage waiting for admission in a Kueue queue, or
preempted and waiting to be re-admitted, or suspended, calls nothing, and a sandbox at full size
then sits outside the queue's quota (16 replicas of the 32B recipe are 128 CPUs and 320 GiB). It is
zero before, after and between those stages and once the run is over.

One exception: a *preflight* waiting for admission keeps its sandbox. The operator creates the
preflight child only once a sandbox replica is ready (``sandbox_gate``); scaling the sandbox down
while the child waits in the queue would undo that gate, and on admission the preflight pod and a
cold sandbox pod would start in the same second (the preflight then spends its own timeout on the
sandbox's image pull). The preflight's sandbox is its smallest size (``desired_sandbox_replicas``).

With an HorizontalPodAutoscaler on the sandbox the operator still writes ``replicas: 0`` whenever
no stage needs it: the HPA controller stops scaling a target at zero (``ScalingDisabled``,
pkg/controller/podautoscaler/horizontal.go, Kubernetes v1.36.3), so without it the sandbox would
never come down. When a stage needs it again the operator lifts a target at zero to the HPA's
``minReplicas`` (at least one) once, and then leaves ``replicas`` to the HPA.
"""

from __future__ import annotations

from retool.spec.model import RetoolRun
from retool.spec.status import StageStatus
from retool_operator.builders import desired_sandbox_replicas

WAITING_STATES = frozenset({"Queued", "Suspended"})


def sandbox_replicas(
    run: RetoolRun,
    current: StageStatus | None,
    *,
    finished: bool,
    autoscaled: bool = False,
    hpa_min_replicas: int | None = None,
    replicas_now: int | None = None,
) -> int | None:
    """The Deployment's ``replicas`` to apply; None leaves the field to the HPA."""
    wanted = desired_sandbox_replicas(run, stage=current.name if current else None, finished=finished)
    if current is not None and current.state in WAITING_STATES and not (current.name == "preflight" and current.state == "Queued"):
        wanted = 0
    if not autoscaled:
        return wanted
    if wanted == 0:
        return 0
    if replicas_now == 0:
        return max(1, hpa_min_replicas or 1)
    return None
