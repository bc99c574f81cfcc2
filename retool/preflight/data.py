"""RL and eval prompts loaded by verl's ``create_rl_dataset`` with a PPO stage's composed config.

That is the trainer's own path (``main_ppo.TaskRunner``): our ``data.custom_cls`` is loaded by file
path, prompts are measured with the tool schema from the rendered tool config and filtered at
``maxPromptLength``, and ``RayPPOTrainer`` then needs one full batch (``drop_last``) of what is
left. A data set that loses every prompt, or keeps fewer than one batch, fails minutes into the
stage on GPUs; here it fails first, with the filter's counts.

Every row names the agent loop that runs it (``agent_name``, written by ``retool data prepare`` from
``spec.recipe``). Data prepared for the other recipe loads without an error and then trains the
wrong thing: tool prompts in a text-only run (the rows still go to ``tool_agent``), or a ReTool
run whose rollouts never see the tool. So each file's agents are checked against the run's recipe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig

from retool.data.schema import AGENT_NAME, agent_name_for
from retool.preflight.checks import CheckResult
from retool.preflight.fields import files_problems
from retool.preflight.fields import summary as fields_summary


@dataclass(frozen=True)
class Prompt:
    """One prompt of a data source, as the scripted rollout needs it."""

    data_source: str
    index: int
    question: str
    """The last user message as the chat holds it (the scripted server finds its episode by it)."""
    ground_truth: str


def _filter_details(dataset: Any) -> dict[str, Any]:
    report = getattr(dataset, "filter_report", None)
    if report is None:
        return {}
    return {"prompts": report.total, "kept": report.kept, "too_long": report.too_long, "unrenderable": report.unrenderable, "max_prompt_length": report.max_prompt_length}


def sources_of(dataset: Any) -> Counter[str]:
    return Counter(str(source) for source in dataset.dataframe["data_source"])


def first_prompts(dataset: Any) -> list[Prompt]:
    """The first prompt of every data source in ``dataset``, in order of appearance."""
    seen: dict[str, Prompt] = {}
    for index, source in enumerate(dataset.dataframe["data_source"]):
        if source in seen:
            continue
        row = dataset.dataframe[index]
        chat = row[dataset.prompt_key]
        question = next(str(m["content"]) for m in reversed(chat) if m["role"] == "user")
        truth = row["reward_model"]["ground_truth"]
        seen[str(source)] = Prompt(str(source), index, question, str(truth.tolist() if hasattr(truth, "tolist") else truth))
    return list(seen.values())


def file_list(files: Any) -> list[str]:
    return [files] if isinstance(files, str) else [str(f) for f in files]


def agents_in(path: str) -> Counter[str] | None:
    """Rows per agent loop of a prepared file, routed as our dataset class routes them (a row that
    names none goes to ``tool_agent``); None when the file cannot be read (loading reports why)."""
    try:
        if "agent_name" not in pq.read_schema(path).names:
            return Counter({AGENT_NAME: pq.read_metadata(path).num_rows})
        names = pq.read_table(path, columns=["agent_name"]).column("agent_name").to_pylist()
    except (OSError, pa.ArrowException):
        return None
    return Counter(name or AGENT_NAME for name in names)


def agent_mismatch(files: Any, recipe: str) -> tuple[str | None, dict[str, dict[str, int]]]:
    """(why the first file whose rows name another agent loop than ``recipe`` runs is wrong, or None;
    the agents found per file)."""
    expected = agent_name_for(recipe)
    found = {path: dict(agents) for path in file_list(files) if (agents := agents_in(path)) is not None}
    for path, agents in found.items():
        other = {name: count for name, count in agents.items() if name != expected}
        if other:
            named = ", ".join(f"{name!r} ({count} of {sum(agents.values())} rows)" for name, count in other.items())
            summary = (
                f"{path} was prepared for another recipe: its rows name the agent loop {named}, "
                f"but recipe {recipe} runs {expected!r} (prepare the data again for this run: retool data prepare all --spec RUN.yaml)"
            )
            return summary, found
    return None, found


def load(config: DictConfig, tokenizer: Any, files: Any, *, is_train: bool) -> Any:
    key = "train_max_samples" if is_train else "val_max_samples"
    from verl.trainer.main_ppo import create_rl_dataset  # verl 0.6.1's (0.9.1 moved it: the 0.9 line's own check uses verl.trainer.ppo.utils)

    return create_rl_dataset(files, config.data, tokenizer, None, is_train=is_train, max_samples=config.data.get(key, -1))


def _load_for_recipe(check: str, config: DictConfig, tokenizer: Any, files: Any, scope: str, recipe: str, *, is_train: bool) -> tuple[CheckResult | None, Any, Any]:
    """(failure, dataset, agents): every row has its required fields, the files name the recipe's agent
    loop and verl's create_rl_dataset loads them."""
    kind = "rl" if is_train else "eval"
    problems, total = files_problems(files, kind)
    if problems:
        details = {"files": file_list(files), "field_problems": [str(p) for p in problems], "field_problem_count": total}
        return CheckResult(check, scope, "failed", fields_summary(problems, total, kind), details), None, None
    mismatch, agents = agent_mismatch(files, recipe)
    if mismatch:
        return CheckResult(check, scope, "failed", mismatch, {"files": file_list(files), "agents": agents, "expected_agent": agent_name_for(recipe)}), None, agents
    try:
        return None, load(config, tokenizer, files, is_train=is_train), agents
    except Exception as exc:
        return CheckResult(check, scope, "failed", f"verl's create_rl_dataset failed on {files}: {type(exc).__name__}: {exc}"), None, agents


def check_rl_data(config: DictConfig, tokenizer: Any, scope: str, recipe: str) -> tuple[CheckResult, Any]:
    """``rl-data``: the training prompts name the recipe's agent loop; at least one batch survives the length filter."""
    files = config.data.train_files
    failure, dataset, agents = _load_for_recipe("rl-data", config, tokenizer, files, scope, recipe, is_train=True)
    if failure is not None:
        return failure, None
    details = {"files": str(files), **_filter_details(dataset), "data_sources": dict(sources_of(dataset)), "agents": agents}
    batch = int(config.data.get("gen_batch_size") or config.data.train_batch_size)
    if len(dataset) < batch:
        summary = (
            f"{len(dataset)} prompts left after filtering, fewer than one batch (spec.rl.batchSize: {batch}): RayPPOTrainer's dataloader (drop_last) "
            "would be empty; lower spec.rl.batchSize or raise spec.rl.maxPromptLength"
        )
        return CheckResult("rl-data", scope, "failed", summary, details), dataset
    try:
        row = dataset[0]
    except Exception as exc:
        return CheckResult("rl-data", scope, "failed", f"reading the first prompt failed: {type(exc).__name__}: {exc}", details), dataset
    details["agent_name"] = str(row.get("agent_name"))
    steps = len(dataset) // batch
    summary = f"{len(dataset)} prompts ({steps} batches of {batch} per epoch)"
    dropped = details.get("prompts", len(dataset)) - len(dataset)
    if dropped:
        return CheckResult("rl-data", scope, "warning", f"{summary}; {dropped} dropped by the length filter at maxPromptLength", details), dataset
    return CheckResult("rl-data", scope, "passed", summary, details), dataset


def check_eval_data(config: DictConfig, tokenizer: Any, scope: str, expected_sources: Sequence[str], recipe: str) -> tuple[CheckResult, Any]:
    """``eval-data``: every eval set names the recipe's agent loop and keeps prompts after the length filter."""
    files = config.data.val_files
    failure, dataset, agents = _load_for_recipe("eval-data", config, tokenizer, files, scope, recipe, is_train=False)
    if failure is not None:
        return failure, None
    counts = sources_of(dataset)
    details = {"files": file_list(files), **_filter_details(dataset), "data_sources": dict(counts), "agents": agents}
    missing = [name for name in expected_sources if counts.get(name, 0) == 0]
    if missing:
        return CheckResult("eval-data", scope, "failed", f"no prompt of eval set(s) {', '.join(missing)} is left after filtering", details), dataset
    summary = ", ".join(f"{name}: {counts[name]}" for name in counts)
    total = details.get("prompts", len(dataset))
    dropped = total - len(dataset)
    if dropped:
        limit = details.get("max_prompt_length", config.data.max_prompt_length)
        text = (
            f"the eval would score {len(dataset)} of {total} problems ({summary}): {dropped} are longer than spec.rl.maxPromptLength ({limit} tokens) "
            "and are dropped; raise spec.rl.maxPromptLength to score them all"
        )
        return CheckResult("eval-data", scope, "warning", text, details), dataset
    return CheckResult("eval-data", scope, "passed", summary, details), dataset
