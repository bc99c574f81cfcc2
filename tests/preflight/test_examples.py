"""Every example passes the preflight on data prepared from tiny local sources, with Qwen's real
tokenizer and our real sandbox: the same checks the preflight stage runs in a cluster, through
``retool preflight`` (the CLI a user runs). The text-only example runs without a sandbox (none is
given or started): its tool and sandbox checks are skipped with that reason, and its scripted
rollouts go through verl's ``single_turn_agent``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.cli import main
from retool.preflight.checks import CHECKS
from retool.preflight.report import REPORT_JSON, REPORT_MD
from retool.preflight.steps import TEXT_ONLY_SANDBOX, TEXT_ONLY_TOOLS
from retool.recipe.metrics import results_by_source, samples_from_rows, validation_metrics
from retool.recipe.render.stages import enabled_stages
from retool.tracking.evaluation import read_sample_rows
from tests.conftest import EXAMPLES
from tests.preflight.conftest import PreparedRun, example_name
from tests.spec.test_model_fit import QWEN_0_5B, QWEN_7B, QWEN_32B

pytestmark = pytest.mark.slow

NAMES = [example_name(p) for p in EXAMPLES]


def example_spec(name: str) -> dict[str, Any]:
    return yaml.safe_load(next(p for p in EXAMPLES if example_name(p) == name).read_text())["spec"]


TOOL_NAMES = [name for name in NAMES if example_spec(name).get("recipe", "tool-integrated") == "tool-integrated"]
TEXT_ONLY_NAMES = [name for name in NAMES if name not in TOOL_NAMES]
SFT_NAMES = [name for name in NAMES if example_spec(name).get("sft", {}).get("enabled", True)]


class Ran:
    def __init__(self, prepared: PreparedRun, code: int, report_dir: Path) -> None:
        self.prepared = prepared
        self.code = code
        self.report_dir = report_dir
        self.report: dict[str, Any] = json.loads((report_dir / REPORT_JSON).read_text())

    def check(self, name: str, scope: str) -> dict[str, Any]:
        found = [c for c in self.report["checks"] if c["check"] == name and scope in [*c["scope"].split("+"), c["scope"]]]
        assert len(found) == 1, f"{name}[{scope}]: {found}"
        return found[0]


MODEL_CONFIGS = {"Qwen/Qwen2.5-32B-Instruct": QWEN_32B, "Qwen/Qwen2.5-7B-Instruct": QWEN_7B, "Qwen/Qwen2.5-0.5B-Instruct": QWEN_0_5B}


def staged_model(tokenizer: str, base: str, directory: Path) -> str:
    """What the prepare stage stages for the preflight to read: the tokenizer files and the model's config.json."""
    shutil.copytree(tokenizer, directory, dirs_exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIGS[base]))
    return str(directory)


@pytest.fixture(scope="module")
def ran(prepare: Callable[[str], PreparedRun], qwen_tokenizer: str, sandbox: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Ran]:
    cache: dict[str, Ran] = {}

    def get(name: str) -> Ran:
        if name not in cache:
            prepared = prepare(name)
            report_dir = tmp_path_factory.mktemp(f"preflight-{name}")
            model = staged_model(qwen_tokenizer, prepared.run.spec.model.base, tmp_path_factory.mktemp(f"model-{name}"))
            # A text-only run needs no sandbox: none is given (and retool preflight starts none).
            sandbox_args = ["--sandbox-url", sandbox] if name in TOOL_NAMES else []
            code = main(["preflight", str(prepared.spec_file), "--tokenizer", model, *sandbox_args, "--report-dir", str(report_dir)])
            cache[name] = Ran(prepared, code, report_dir)
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_every_example_passes_every_check_of_every_stage_it_runs(ran: Callable[[str], Ran], name: str) -> None:
    result = ran(name)
    assert result.code == 0, result.report["failure"]
    assert result.report["passed"] is True and result.report["exit_code"] == 0
    stages = [s for s in ("sft", "rl", "eval") if s in enabled_stages(result.prepared.run)]
    assert result.report["stages"] == stages
    statuses = {(c["check"], c["scope"]): c["status"] for c in result.report["checks"]}
    assert not [key for key, status in statuses.items() if status == "failed"]
    skipped = {c["check"]: c["summary"] for c in result.report["checks"] if c["status"] == "skipped"}
    assert skipped == ({} if name in TOOL_NAMES else {"tools": TEXT_ONLY_TOOLS, "sandbox": TEXT_ONLY_SANDBOX})
    assert statuses[("model", "run")] == "passed", "every example fits its model (config.json staged beside the tokenizer)"
    assert {check for check, _ in statuses} == {c.name for c in CHECKS} - ({"sft-data"} if name not in SFT_NAMES else set())
    for stage in stages:
        result.check("config", stage)
    for stage in ("rl", "eval"):
        assert result.check("rollout", stage)["status"] == "passed"
        assert result.check("trainer-batch", stage)["status"] == "passed"
    markdown = (result.report_dir / REPORT_MD).read_text()
    run = result.prepared.run
    assert markdown.startswith(f"# Preflight of {run.metadata.namespace or 'default'}/{run.metadata.name}: passed")


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_one_scripted_rollout_per_data_source_calls_the_sandbox_and_earns_a_right_answers_reward(ran: Callable[[str], Ran], name: str) -> None:
    result = ran(name)
    run = result.prepared.run
    eval_sets = [e.name for e in run.spec.data.eval]
    rl = result.check("rollout", "rl")
    assert rl["summary"].endswith("of math_dapo called the sandbox and scored 1")
    assert rl["details"]["flows"] == ["training step"], "the rl stage's validation is the eval stage's, checked there"
    assert rl["details"]["samples"] == rl["details"]["requests"] == rl["details"]["tool_calls"] >= run.spec.rl.rollout_n
    evaluation = result.check("rollout", "eval")
    assert f"of {', '.join(eval_sets)} called the sandbox" in evaluation["summary"]
    assert evaluation["details"]["tool_calls"] == evaluation["details"]["requests"] >= len(eval_sets) * run.spec.eval.samples_per_problem
    assert rl["details"]["agents"] == {"tool_agent": rl["details"]["samples"]}


@pytest.mark.parametrize("name", TEXT_ONLY_NAMES)
def test_a_text_only_run_rolls_out_through_verls_single_turn_agent_without_a_sandbox_and_earns_a_right_answers_reward(ran: Callable[[str], Ran], name: str) -> None:
    result = ran(name)
    run = result.prepared.run
    assert result.report["recipe"] == "text-only" and result.report["sandbox_url"] is None
    assert "; no sandbox;" in (result.report_dir / REPORT_MD).read_text()
    eval_samples = len(run.spec.data.eval) * run.spec.eval.samples_per_problem
    for stage, sources, samples in (("rl", "math_dapo", run.spec.rl.rollout_n), ("eval", ", ".join(e.name for e in run.spec.data.eval), eval_samples)):
        rollout = result.check("rollout", stage)
        assert rollout["summary"].endswith(f"of {sources} (verl's single_turn_agent, no tool) scored 1")
        details = rollout["details"]
        assert details["agents"] == {"single_turn_agent": details["samples"]} and details["agent_loop"] == "single_turn_agent"
        assert details["samples"] == details["requests"] >= samples and details["tool_calls"] == 0
    for check in ("rl-data", "eval-data"):
        assert {agent for agents in result.check(check, "rl")["details"]["agents"].values() for agent in agents} == {"single_turn_agent"}


@pytest.mark.parametrize("name", NAMES)
def test_the_retool_reward_joins_the_trainer_batch_and_eval_results_keep_their_data_source(ran: Callable[[str], Ran], name: str) -> None:
    """verl 0.6.1's trainer joins the agent loop's output (with every reward key as a column) to its
    batch in training and validation; retool's eval report reads verl's validation dump per data source."""
    result = ran(name)
    run = result.prepared.run
    assert result.check("trainer-batch", "rl")["details"]["flows"] == ["training step"]
    evaluation = result.check("trainer-batch", "eval")
    eval_sets = [e.name for e in run.spec.data.eval]
    core = evaluation["details"]["validation_metrics"]
    for eval_set in eval_sets:
        assert core[f"val-core/{eval_set}/acc/mean@{run.spec.eval.samples_per_problem}"] == 1.0
    rows = read_sample_rows(str(result.report_dir / "eval" / "validation" / "0.jsonl"))
    assert {row["source"] for row in rows} == set(eval_sets) and "data_source" not in rows[0]
    assert sorted(results_by_source(validation_metrics(*samples_from_rows(rows)))) == sorted(eval_sets)


@pytest.mark.parametrize("name", SFT_NAMES)
def test_sft_token_lengths_are_reported_against_max_length(ran: Callable[[str], Ran], name: str) -> None:
    result = ran(name)
    sft = result.check("sft-data", "sft")
    assert sft["details"]["max_length"] == result.prepared.run.spec.sft.max_length
    assert sft["details"]["rows"] == 24 and sft["details"]["over_max_length"] == 0
    assert 0 < sft["details"]["p50"] <= sft["details"]["p99"] <= sft["details"]["max"]
    assert result.report["facts"]["sft_tokens_p99"] == sft["details"]["p99"]
    # Qwen3's template renders every assistant turn's (empty) thinking when it is the last turn, so
    # verl's per-turn tokenization differs from the whole conversation: reported, not fatal.
    assert sft["status"] == "warning" and sft["details"]["per_turn_rendering_differs"] > 0
