"""Admission review rules, the kopf validating handler called with review data, and render_manifests."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys

import kopf
import pytest
import yaml

from retool.spec.validate import SpecError
from retool_operator import handlers
from retool_operator.render import desired_objects, render_manifests
from retool_operator.webhook import review
from tests.conftest import EXAMPLES, repo_env
from tests.operator.helpers import CONFIG, config_for, document


def started(doc: dict, *names: str) -> dict:
    out = copy.deepcopy(doc)
    out["status"] = {"stages": [{"name": n, "state": "Succeeded" if i < len(names) - 1 else "Running", "attempt": 1} for i, n in enumerate(names)]}
    return out


def edit(doc: dict, section: str, key: str, value: object) -> dict:
    out = copy.deepcopy(doc)
    out["spec"].setdefault(section, {})[key] = value
    return out


BASE = document()

REVIEWS = [
    ("valid-create-is-admitted", "CREATE", BASE, None, []),
    ("unknown-field-names-the-field", "CREATE", edit(BASE, "rl", "stepz", 5), None, ["spec.rl.stepz: unknown field"]),
    ("cross-field-rule-names-the-field", "CREATE", edit(BASE, "rl", "miniBatchSize", 1000), None, ["spec.rl.miniBatchSize"]),
    ("rescaling-the-sandbox-mid-run-is-allowed", "UPDATE", edit(BASE, "sandbox", "maxConcurrent", 64), started(BASE, "prepare", "sft"), []),
    ("suspending-mid-run-is-allowed", "UPDATE", {**BASE, "spec": {**BASE["spec"], "suspend": True}}, started(BASE, "prepare", "sft", "merge", "rl"), []),
    ("changing-the-model-after-prepare-is-refused", "UPDATE", edit(BASE, "model", "base", "Qwen/Qwen2.5-7B-Instruct"), started(BASE, "prepare"), ["spec.model: cannot change"]),
    ("changing-a-finished-stages-settings-is-refused", "UPDATE", edit(BASE, "sft", "epochs", 3), started(BASE, "prepare", "sft", "merge"), ["spec.sft: cannot change"]),
    ("changing-rl-before-rl-started-is-allowed", "UPDATE", edit(BASE, "rl", "steps", 100), started(BASE, "prepare", "sft"), []),
    ("changing-running-rl-is-refused", "UPDATE", edit(BASE, "rl", "steps", 100), started(BASE, "prepare", "sft", "merge", "rl"), ["spec.rl: cannot change after stage rl started"]),
    ("changing-hardware-before-a-gpu-stage-is-allowed", "UPDATE", edit(BASE, "hardware", "nodes", 2), started(BASE, "prepare"), []),
    ("moving-to-the-0.9-line-before-sft-is-allowed", "UPDATE", edit(BASE, "trainer", "verl", "0.9.1"), started(BASE, "prepare"), []),
    (
        "moving-to-the-0.9-line-once-sft-started-is-refused",
        "UPDATE",
        edit(BASE, "trainer", "verl", "0.9.1"),
        started(BASE, "prepare", "sft"),
        ["spec.trainer: cannot change after stage sft started"],
    ),
    (
        "changing-hardware-once-a-gpu-stage-started-is-refused",
        "UPDATE",
        edit(BASE, "hardware", "nodes", 2),
        started(BASE, "prepare", "sft"),
        ["spec.hardware: cannot change after stage sft started"],
    ),
    (
        "switching-to-text-only-after-prepare-is-refused",
        "UPDATE",
        {**BASE, "spec": {**BASE["spec"], "recipe": "text-only", "sft": {"enabled": False}}},
        started(BASE, "prepare"),
        ["spec.recipe: cannot change after stage prepare started"],
    ),
    ("queueing-a-run-before-a-stage-started-is-allowed", "UPDATE", edit(BASE, "scheduling", "queueName", "team-a"), BASE, []),
    ("delete-is-not-reviewed", "DELETE", None, BASE, []),
]


@pytest.mark.parametrize(("operation", "new", "old", "expected"), [r[1:] for r in REVIEWS], ids=[r[0] for r in REVIEWS])
def test_review(operation: str, new: dict | None, old: dict | None, expected: list[str]) -> None:
    problems = review(operation, new, old)
    assert len(problems) == len(expected)
    for problem, fragment in zip(problems, expected, strict=True):
        assert fragment in problem


def test_kopf_validating_handler_refuses_with_field_named_message() -> None:
    """The registered handler (id validate-retoolrun), called as kopf calls it for an AdmissionReview."""
    bad = edit(BASE, "sandbox", "perReplicaConcurrency", 64)
    with pytest.raises(kopf.AdmissionError, match=r"spec\.sandbox\.perReplicaConcurrency: 64 is larger than sandbox\.maxConcurrent") as err:
        asyncio.run(handlers.validate_retoolrun(body=kopf.Body(bad), old=None, operation="CREATE", warnings=[], memo=kopf.Memo()))
    assert err.value.code == 422


def test_kopf_validating_handler_admits_an_unknown_gpu_product_with_a_warning_naming_the_label_value() -> None:
    warnings: list[str] = []
    asyncio.run(handlers.validate_retoolrun(body=kopf.Body(edit(BASE, "hardware", "product", "H200")), old=None, operation="CREATE", warnings=warnings, memo=kopf.Memo()))
    assert len(warnings) == 1 and "spec.hardware.product" in warnings[0] and "did you mean 'NVIDIA-H200'" in warnings[0]
    warnings.clear()
    asyncio.run(handlers.validate_retoolrun(body=kopf.Body(edit(BASE, "hardware", "product", "NVIDIA-H200")), old=None, operation="CREATE", warnings=warnings, memo=kopf.Memo()))
    assert warnings == []
    assert asyncio.run(handlers.validate_retoolrun(body=kopf.Body(BASE), old=None, operation="CREATE", warnings=[], memo=kopf.Memo())) is None


@pytest.mark.parametrize(("enabled", "expected"), [("true", ["validate-retoolrun"]), ("false", [])], ids=["webhook-enabled-registers-it", "webhook-disabled-does-not"])
def test_validating_handler_registration_follows_config(enabled: str, expected: list[str]) -> None:
    code = "import kopf, retool_operator.handlers; print([h.id for h in kopf.get_default_registry()._webhooks.get_all_handlers()])"
    out = subprocess.run([sys.executable, "-c", code], env=repo_env(RETOOL_OPERATOR_WEBHOOK_ENABLED=enabled), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(expected)


@pytest.mark.parametrize("stage", [None, "prepare", "sft", "merge", "rl", "eval"], ids=lambda s: f"stage-{s or 'all'}")
def test_render_lists_spec_sandbox_and_stage_children(stage: str | None) -> None:
    objects = list(yaml.safe_load_all(render_manifests(BASE, config=CONFIG, stage=stage)))
    kinds = [o["kind"] for o in objects]
    assert kinds[:4] == ["Service", "NetworkPolicy", "PodDisruptionBudget", "Deployment"]
    children = [o["metadata"]["name"] for o in objects[4:]]
    expected = [f"demo-{s}-1" for s in (["prepare", "sft", "merge", "rl", "eval"] if stage is None else [stage])]
    assert children == [name for child in expected for name in (f"{child}-spec", child)]  # each child after its spec snapshot
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "uid-1" for o in objects)


def test_render_rejects_invalid_runs_and_unknown_stages() -> None:
    with pytest.raises(SpecError, match=r"spec\.rl\.stepz"):
        render_manifests(edit(BASE, "rl", "stepz", 5), config=CONFIG)
    with pytest.raises(ValueError, match="unknown stage 'train'"):
        render_manifests(BASE, config=CONFIG, stage="train")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_every_example(example) -> None:
    """The claim the operator creates, the sandbox set (4, unless text-only) and a child per enabled stage, each with its spec snapshot."""
    from retool.spec.validate import parse_run
    from retool_operator.reconcile import enabled_stages

    doc = yaml.safe_load(example.read_text())
    run = parse_run(doc)
    expected = (run.spec.storage.pvc.claim_name is None) + (4 if run.spec.recipe == "tool-integrated" else 0) + 2 * sum(enabled_stages(run).values())
    assert len(desired_objects(doc, config=config_for(doc))) == expected


def test_the_webhook_refuses_what_this_operator_cannot_schedule() -> None:
    gang = document(scheduling={"gang": {"enabled": True}})
    problems = review("CREATE", gang, None, CONFIG)
    assert len(problems) == 1 and problems[0].startswith("spec.scheduling.gang.enabled: this operator knows no batch scheduler")
    assert review("CREATE", gang, None, CONFIG.model_copy(update={"batch_scheduler": "yunikorn"})) == []
    queued = document(scheduling={"queueName": "team-a"})
    assert review("CREATE", queued, None, CONFIG) == []
    assert "queue every stage twice" in review("CREATE", queued, None, CONFIG.model_copy(update={"batch_scheduler": "volcano"}))[0]


def test_kopf_validating_handler_applies_the_operators_sandbox_replica_limit() -> None:
    """The chart's limits.sandboxReplicas reaches the webhook through the operator's config in the memo."""
    wide = edit(BASE, "sandbox", "maxConcurrent", 80)
    memo = kopf.Memo(config=CONFIG.model_copy(update={"sandbox_max_replicas": 4}))
    with pytest.raises(kopf.AdmissionError, match="sandboxMaxReplicas"):
        asyncio.run(handlers.validate_retoolrun(body=kopf.Body(wide), old=None, operation="CREATE", warnings=[], memo=memo))
    asyncio.run(handlers.validate_retoolrun(body=kopf.Body(wide), old=None, operation="CREATE", warnings=[], memo=kopf.Memo(config=CONFIG)))
