"""The kopf handlers: thin adapters from kopf's events to ``Reconciler`` passes and webhook reviews.

Start with ``python -m retool_operator`` (see ``__main__``), or
``kopf run -m retool_operator.handlers --standalone --liveness=http://0.0.0.0:8080/healthz --all-namespaces``.
kopf keeps its progress and diff-base in ``kopf.retool.dev/*`` annotations: the RetoolRun status
schema is structural and would prune kopf's fields. No handler returns a value (that would be
written to status); every handler only triggers an idempotent pass.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from retool_operator import constants as c
from retool_operator import logcontext
from retool_operator.cluster_warnings import priority_class_warnings
from retool_operator.config import OperatorConfig
from retool_operator.kube import KubeClient, credentials_from
from retool_operator.reconcile import Event
from retool_operator.runner import Reconciler
from retool_operator.tracking import parent_run_factory
from retool_operator.webhook import review, review_warnings

log = logging.getLogger(__name__)

CONFIG = OperatorConfig()

# MLflow's client retries for minutes by default; a pass must not hold a worker thread that long
# (an unreachable tracker is "not yet", retried on the next pass).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
RUN_RESOURCE = (c.GROUP, c.VERSION, c.RUN_PLURAL)
CHILD_SELECTOR = {c.LABEL_RUN: kopf.PRESENT, c.LABEL_ROLE: c.COMPONENT_STAGE}
# The same filter, on the API server: kopf's ``labels=`` on a handler filters the events it has
# already received (client side), so without this the operator would list and watch every Job
# and RayJob of the cluster. ``settings.watching.label_selectors`` goes into the list and watch
# requests' labelSelector.
CHILD_LABEL_SELECTOR = f"{c.LABEL_RUN},{c.LABEL_ROLE}={c.COMPONENT_STAGE}"
CHILD_RESOURCES = (("batch", "jobs"), ("ray.io", "rayjobs"))


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """kopf settings: annotation storage, no peering, quiet events, optional admission server."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=c.KOPF_ANNOTATION_PREFIX)
    settings.persistence.finalizer = f"{c.KOPF_ANNOTATION_PREFIX}/finalizer"
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING  # our own Events say what happened; kopf's would repeat them
    settings.watching.server_timeout = 300
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = CHILD_LABEL_SELECTOR
    settings.networking.connect_timeout = 10
    if config.webhook_enabled:
        settings.admission.server = kopf.WebhookServer(
            addr=config.bind_address,  # all interfaces in a pod: the API server comes through the Service
            port=config.webhook_port,
            certfile=os.path.join(config.webhook_cert_dir, "tls.crt"),
            pkeyfile=os.path.join(config.webhook_cert_dir, "tls.key"),
        )
        settings.admission.managed = None  # the chart owns the ValidatingWebhookConfiguration


def post_event(body: dict[str, Any], event: Event) -> None:
    kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1024])


_CONNECTION: list[Any] = []


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else kubeconfig; remembered so our client uses the same identity."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        _CONNECTION[:] = [info]
    return info


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Settings, and the memo shared by every handler (tests may pre-fill ``config``)."""
    logcontext.install()  # every log line of a pass names its run
    config = memo.get("config") or CONFIG
    configure(settings, config)
    memo.config = config
    # One holder object in the operator-wide memo: kopf gives each object a shallow copy of it,
    # so every handler shares this one Reconciler (one client session, one lock per run).
    memo.shared = SharedState()


class SharedState:
    """Operator-wide state reachable from every handler's memo."""

    def __init__(self) -> None:
        self.reconciler: Reconciler | None = None


def _reconciler(memo: kopf.Memo) -> Reconciler:
    shared: SharedState = memo.shared
    if shared.reconciler is None:
        if not _CONNECTION:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
        factory = parent_run_factory() if memo.config.mlflow_parent_runs else None
        client = KubeClient(credentials_from(_CONNECTION[0]), verify_seconds=memo.config.resync_seconds)
        shared.reconciler = Reconciler(client, memo.config, post_event=post_event, parent_factory=factory)
    return shared.reconciler


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    reconciler = memo.shared.reconciler
    if reconciler is not None:
        reconciler.shutdown()
        await reconciler.client.close()
        await reconciler.isolation.close()


@kopf.on.create(*RUN_RESOURCE)
@kopf.on.resume(*RUN_RESOURCE)
@kopf.on.update(*RUN_RESOURCE, field="spec")
async def run_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Create, operator restart, or a spec edit: one pass (invalid specs end in phase Failed)."""
    await _reconciler(memo).trigger(namespace, name)


@kopf.timer(*RUN_RESOURCE, interval=CONFIG.resync_seconds, initial_delay=CONFIG.resync_seconds)
async def resync(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Level-triggered safety net: re-derive status from the children even if an event was missed."""
    await _reconciler(memo).trigger(namespace, name)


@kopf.on.event("ray.io", "v1", "rayjobs", labels=CHILD_SELECTOR)
@kopf.on.event("batch", "v1", "jobs", labels=CHILD_SELECTOR)
async def stage_child_event(meta: kopf.Meta, body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A stage's Job or RayJob changed (or was deleted): re-reconcile its run (success, failure, suspension).

    A finished child's last state is remembered first: KubeRay may delete a finished RayJob before
    the pass reads it (``DELETE_RAYJOB_CR_AFTER_JOB_FINISHES``); a child being deleted that the
    operator's finalizer holds is let go here when its run no longer needs it (the run is gone)."""
    reconciler = _reconciler(memo)
    reconciler.note_child(namespace, dict(body))
    await reconciler.settle_deleted_child(namespace, dict(body))
    await reconciler.trigger(namespace, meta["labels"][c.LABEL_RUN])


@kopf.on.delete(*RUN_RESOURCE, optional=True)
async def run_deleted(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Children go with the run through owner references; checkpoints (PVC) and MLflow stay."""
    reconciler = memo.shared.reconciler
    if reconciler is not None:
        reconciler.forget(namespace, name)


async def validate_retoolrun(body: kopf.Body, old: kopf.BodyEssence | None, operation: str | None, warnings: list[str], memo: kopf.Memo, **_: Any) -> None:
    """Admission: the pydantic model and cross-field rules, the operator's limits, plus no edits to
    started stages' inputs; what is accepted but looks wrong (a GPU product no node carries, a
    PriorityClass the cluster lacks) comes back as a warning."""
    config: OperatorConfig = memo.get("config") or CONFIG
    problems = review(operation or "", dict(body), dict(old) if old else None, config)
    if problems:
        raise kopf.AdmissionError("invalid RetoolRun: " + "; ".join(problems), code=422)
    warnings.extend(review_warnings(operation or "", dict(body)))
    if memo.get("shared") is None:  # called outside a running operator (no API client): no cluster reads
        return
    try:
        client = _reconciler(memo).client
    except kopf.TemporaryError:  # not logged in yet: no cluster reads, the rest of the review stands
        return
    warnings.extend(await priority_class_warnings(client, dict(body)))


# kopf refuses to start with admission handlers but no admission server, so the handler is
# registered only when the webhook is enabled (the create path checks the same rules regardless).
if CONFIG.webhook_enabled:
    kopf.on.validate(*RUN_RESOURCE, id="validate-retoolrun", operations=["CREATE", "UPDATE"])(validate_retoolrun)
