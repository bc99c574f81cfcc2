"""The operator's finalizers: when the outcome finalizer may go (``reconcile.outcome_recorded``), and the
names the docs give are the ones the operator writes.

An administrator removes a finalizer by hand with the name the docs give (docs/operations.md: a run left
Terminating after the operator was uninstalled, a RayJob whose operator is gone) and checks a RayJob's
``metadata.finalizers`` against it: a name changed in code alone leaves those commands pointing at nothing,
and every object created before the change holds a finalizer no operator releases any more.
"""

from __future__ import annotations

import re

import kopf
import pytest

from retool.spec.status import RetoolRunStatus, StageStatus
from retool_operator import constants as c
from retool_operator.handlers import configure
from retool_operator.reconcile import outcome_recorded
from tests.conftest import REPO
from tests.operator.helpers import CONFIG


def held(name: str, stage: str = "sft") -> dict[str, object]:
    """A stage RayJob being deleted (KubeRay after it finished, the garbage collector, someone) while the finalizer holds it."""
    labels = {c.LABEL_RUN: "demo", c.LABEL_STAGE: stage}
    return {"metadata": {"name": name, "labels": labels, "finalizers": [c.FINALIZER_OUTCOME], "deletionTimestamp": "2026-01-01T12:00:00Z"}}


def sft(state: str, attempt: int, job: str) -> RetoolRunStatus:
    return RetoolRunStatus(stages=[StageStatus(name="prepare", state="Succeeded", attempt=1, job="demo-prepare-1"), StageStatus(name="sft", state=state, attempt=attempt, job=job)])


RECORDED_CASES = [
    # (what, the run's status, the held child, may the finalizer go)
    ("its stage still follows it (Running): its outcome is not in the status yet", sft("Running", 1, "demo-sft-1"), "demo-sft-1", False),
    ("... Queued", sft("Queued", 1, "demo-sft-1"), "demo-sft-1", False),
    ("... Suspended", sft("Suspended", 1, "demo-sft-1"), "demo-sft-1", False),
    ("its success is recorded", sft("Succeeded", 1, "demo-sft-1"), "demo-sft-1", True),
    ("its failure is recorded (the run failed)", sft("Failed", 1, "demo-sft-1"), "demo-sft-1", True),
    ("its failure is recorded (a retry is due)", sft("Retrying", 1, "demo-sft-1"), "demo-sft-1", True),
    ("the previous attempt's, while the next attempt runs", sft("Running", 2, "demo-sft-2"), "demo-sft-1", True),
    ("a status that never named its stage", RetoolRunStatus(), "demo-sft-1", True),
]


@pytest.mark.parametrize(("status", "child", "recorded"), [x[1:] for x in RECORDED_CASES], ids=[x[0] for x in RECORDED_CASES])
def test_the_outcome_finalizer_may_go_once_the_status_no_longer_needs_the_child(status: RetoolRunStatus, child: str, recorded: bool) -> None:
    assert outcome_recorded(status, held(child)) is recorded


def kopf_finalizer() -> str:
    """The finalizer kopf puts on every run, as the operator configures kopf at start."""
    settings = kopf.OperatorSettings()
    configure(settings, CONFIG)
    return settings.persistence.finalizer


def documented(path: str, pattern: str) -> list[str]:
    """Every name ``pattern`` (one group) finds in ``path``, with the doc's line breaks read as spaces."""
    text = " ".join((REPO / path).read_text().split())
    return re.findall(pattern, text)


STATEMENTS = [
    # (doc, the sentence that names a finalizer, which one)
    ("docs/operations.md", r"Every run carries one finalizer, `([^`]+)`", "run"),
    ("docs/operations.md", r"Every stage RayJob is created with the finalizer `([^`]+)`", "outcome"),
    ("docs/operations.md", r"that index 0 is `([^`]+)`", "outcome"),
    ("docs/operations.md", r"the `([^`]+)` finalizer keeps the RayJob", "outcome"),
    ("docs/install.md", r"kopf's on each run, `([^`]+)` on each stage RayJob", "outcome"),
]


@pytest.mark.parametrize(("path", "pattern", "which"), STATEMENTS, ids=[f"{s[0]}: {s[1][:40]}" for s in STATEMENTS])
def test_each_documented_finalizer_name_is_the_one_the_operator_writes(path: str, pattern: str, which: str) -> None:
    names = documented(path, pattern)
    assert names, f"{path} no longer says {pattern!r}: update this test with the doc"
    expected = kopf_finalizer() if which == "run" else c.FINALIZER_OUTCOME
    assert set(names) == {expected}, f"{path} names {names}, the operator writes {expected!r}"


def test_the_finalizer_names_stay_what_earlier_versions_wrote() -> None:
    """A rename, in the docs too, still strands what the operator created before it: those runs and RayJobs
    hold the old name, and nothing removes it any more (kopf removes only its configured finalizer,
    ``Reconciler._release`` only ``FINALIZER_OUTCOME``). A rename needs a migration that releases the old one."""
    assert kopf_finalizer() == "kopf.retool.dev/finalizer"
    assert c.FINALIZER_OUTCOME == "retool.dev/stage-outcome"
