"""Admission reviews always end in an answer, and the operator's replica limit is enforced."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from retool_operator import webhook
from retool_operator.config import OperatorConfig
from retool_operator.webhook import review
from tests.operator.helpers import document

BASE = document()


def with_status(status: Any, **spec_changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out["status"] = status
    for section, values in spec_changes.items():
        out["spec"][section] = {**out["spec"].get(section, {}), **values}
    return out


MALFORMED_OLD = [
    ("status is a list", with_status([1, 2])),
    ("status is a string", with_status("Running")),
    ("stages is a string", with_status({"stages": "rl"})),
    ("stages is a mapping", with_status({"stages": {"name": "rl", "state": "Running"}})),
    ("a stage is a string", with_status({"stages": ["rl", None, 7]})),
    ("a stage name is a list", with_status({"stages": [{"name": ["rl"], "state": "Running"}]})),
    ("a stage state is a mapping", with_status({"stages": [{"name": "rl", "state": {"phase": "Running"}}]})),
    ("old spec is a list", {**with_status({"stages": []}), "spec": ["model"]}),
    ("old object is not a mapping", ["not", "an", "object"]),
]


@pytest.mark.parametrize("old", [c[1] for c in MALFORMED_OLD], ids=[c[0] for c in MALFORMED_OLD])
def test_a_malformed_old_status_never_breaks_a_review(old: Any) -> None:
    new = copy.deepcopy(BASE)
    new["spec"]["rl"] = {"steps": 100}
    assert review("UPDATE", new, old, max_sandbox_replicas=64) == []


def test_a_malformed_old_spec_after_a_started_stage_refuses_rather_than_crashes() -> None:
    old = {**with_status({"stages": [{"name": "prepare", "state": "Succeeded"}]}), "spec": "garbage"}
    problems = review("UPDATE", copy.deepcopy(BASE), old, max_sandbox_replicas=64)
    assert problems and all("cannot change after stage prepare started" in p for p in problems)


def test_well_formed_stages_of_a_partly_malformed_status_still_count() -> None:
    old = with_status({"stages": ["garbage", {"name": "prepare", "state": "Succeeded"}, {"name": 5}]})
    new = copy.deepcopy(BASE)
    new["spec"]["model"] = {"base": "Qwen/Qwen2.5-7B-Instruct"}
    problems = review("UPDATE", new, old, max_sandbox_replicas=64)
    assert len(problems) == 1 and problems[0].startswith("spec.model: cannot change after stage prepare started")


@pytest.mark.parametrize("new", [["a", "list"], "text", 7], ids=["list", "string", "number"])
def test_an_object_that_is_not_a_mapping_is_not_reviewed_into_a_crash(new: Any) -> None:
    assert review("CREATE", new, None) == []


@pytest.mark.parametrize(("max_concurrent", "refused"), [(16 * 20, False), (16 * 20 + 1, True)], ids=["20 replicas at a limit of 20", "21 replicas at a limit of 20"])
def test_the_operators_sandbox_replica_limit(max_concurrent: int, refused: bool) -> None:
    doc = document(sandbox={"maxConcurrent": max_concurrent, "perReplicaConcurrency": 16})
    problems = review("CREATE", doc, None, max_sandbox_replicas=20)
    if refused:
        assert problems == [
            "spec.sandbox.maxConcurrent: 321 executions at 16 per replica need 21 sandbox replicas; "
            "at most 20 are allowed (operator setting sandboxMaxReplicas): lower maxConcurrent or raise perReplicaConcurrency"
        ]
    else:
        assert problems == []


def test_the_limit_defaults_to_the_operators_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS", "4")
    webhook.configured_replica_cap.cache_clear()
    try:
        assert webhook.configured_replica_cap() == 4
        assert review("CREATE", document(sandbox={"maxConcurrent": 80, "perReplicaConcurrency": 16}), None)[0].startswith("spec.sandbox.maxConcurrent")
    finally:
        webhook.configured_replica_cap.cache_clear()


def test_the_configured_limit_cannot_exceed_the_contracts() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1024"):
        OperatorConfig(_env_file=None, sandbox_max_replicas=5000)
    assert OperatorConfig(_env_file=None).sandbox_max_replicas == 256
