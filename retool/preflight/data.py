"""RL and eval prompts loaded by verl's ``create_rl_dataset`` with a PPO stage's composed config.

That is the trainer's own path (``main_ppo.TaskRunner``): our ``data.custom_cls`` is loaded by file
path, prompts are measured with the tool schema from the rendered tool config and filtered at
``maxPromptLength``, and ``RayPPOTrainer`` then needs one full batch (``drop_last``) of what is
left. A data set that loses every prompt, or keeps fewer than one batch, fails minutes into the
stage on GPUs; here it fails first, with the filter's counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig
from verl.trainer.main_ppo import create_rl_dataset

from retool.preflight.checks import CheckResult


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


def load(config: DictConfig, tokenizer: Any, files: Any, *, is_train: bool) -> Any:
    key = "train_max_samples" if is_train else "val_max_samples"
    return create_rl_dataset(files, config.data, tokenizer, None, is_train=is_train, max_samples=config.data.get(key, -1))


def check_rl_data(config: DictConfig, tokenizer: Any, scope: str) -> tuple[CheckResult, Any]:
    """``rl-data``: the training prompts; at least one batch must survive the length filter."""
    files = config.data.train_files
    try:
        dataset = load(config, tokenizer, files, is_train=True)
    except Exception as exc:
        return CheckResult("rl-data", scope, "failed", f"verl's create_rl_dataset failed on {files}: {type(exc).__name__}: {exc}"), None
    details = {"files": str(files), **_filter_details(dataset), "data_sources": dict(sources_of(dataset))}
    batch = int(config.data.get("gen_batch_size") or config.data.train_batch_size)
    if len(dataset) < batch:
        summary = f"{len(dataset)} prompts left after filtering, fewer than one batch (data.train_batch_size={batch}): RayPPOTrainer's dataloader (drop_last) would be empty"
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


def check_eval_data(config: DictConfig, tokenizer: Any, scope: str, expected_sources: Sequence[str]) -> tuple[CheckResult, Any]:
    """``eval-data``: every eval set keeps prompts after the length filter."""
    files = config.data.val_files
    try:
        dataset = load(config, tokenizer, files, is_train=False)
    except Exception as exc:
        return CheckResult("eval-data", scope, "failed", f"verl's create_rl_dataset failed on {files}: {type(exc).__name__}: {exc}"), None
    counts = sources_of(dataset)
    details = {"files": [str(f) for f in files] if not isinstance(files, str) else [files], **_filter_details(dataset), "data_sources": dict(counts)}
    missing = [name for name in expected_sources if counts.get(name, 0) == 0]
    if missing:
        return CheckResult("eval-data", scope, "failed", f"no prompt of eval set(s) {', '.join(missing)} is left after filtering", details), dataset
    summary = ", ".join(f"{name}: {counts[name]}" for name in counts)
    dropped = details.get("prompts", len(dataset)) - len(dataset)
    if dropped:
        return CheckResult("eval-data", scope, "warning", f"{summary}; {dropped} dropped by the length filter at maxPromptLength", details), dataset
    return CheckResult("eval-data", scope, "passed", summary, details), dataset
