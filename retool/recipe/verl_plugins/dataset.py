"""verl ``data.custom_cls`` for ReTool RL: prompt lengths measured WITH the tool schema, overlong prompts
filtered and counted, and every row routed to verl's ``tool_agent`` loop (unless the row names another
loop: the text-only baseline's rows name ``single_turn_agent`` and are measured without tools).

Why not plain ``RLHFDataset``: the tool agent renders each prompt with the code-interpreter schema in
the system block, which adds a few hundred tokens; measured without it, a prompt that fits
``max_prompt_length`` in the dataset overflows in the rollout. The public recipe does not filter at
all, so one long DAPO problem can fail a step hours into a run. Here every prompt is measured with
the schema from ``data.tool_config_path`` (verl fills it from the rollout's tool config), or with the
built-in ``code_interpreter`` schema when none is configured; longer ones are dropped before
training, and how many is logged.

Configure with ``data.custom_cls.path=<this file>`` and ``data.custom_cls.name=RetoolRLDataset``.
verl loads the file by path as a throwaway module; see the end of the file for how the class stays
picklable for datasets' worker processes and DataLoader workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
from verl.utils.dataset.rl_dataset import RLHFDataset

from retool.data.schema import AGENT_NAME, code_interpreter_tool
from retool.recipe.verl_plugins.prompt_filter import LENGTH_COLUMN, UNRENDERABLE, PromptFilterReport, filter_report, prompt_token_count

logger = logging.getLogger(__name__)

MEASURE_VERSION = "1"
"""Part of the measured dataset's fingerprint: change it when ``measure`` counts differently."""


def measure_fingerprint(dataset_fingerprint: str, tokenizer: Any, tools: Any, template_kwargs: dict[str, Any], prompt_key: str) -> str | None:
    """The fingerprint of the prompt lengths ``maybe_filter_out_long_prompts`` adds, from what decides them.

    Left to itself, ``Dataset.map`` fingerprints the mapped function by dill-pickling its closure, the
    tokenizer included. transformers 5 (verl 0.9.1's line) pickles a tokenizer slowly: 6.3 s for each
    dataset here, against 0.1 s with transformers 4. What decides a prompt's length is the dataset, the
    tokenizer's own serialized state (vocabulary, merges, added tokens), its chat template and special
    tokens, the tool schemas and the template's arguments, all hashed here in tens of milliseconds. None
    (let ``datasets`` hash) for a tokenizer without that serialized state (a slow tokenizer). 32 hex
    digits: ``datasets`` appends a shard suffix to a fingerprint of at most 64 characters."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    digest = hashlib.sha256()
    for part in (
        MEASURE_VERSION,
        dataset_fingerprint,
        prompt_key,
        backend.to_str(),
        str(getattr(tokenizer, "chat_template", None)),
        json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str),
        json.dumps(tools, sort_keys=True, default=str),
        json.dumps(template_kwargs, sort_keys=True, default=str),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


class RetoolRLDataset(RLHFDataset):
    """``RLHFDataset`` that always filters overlong prompts (measured with tools) and routes to ``tool_agent``."""

    def __init__(self, data_files: Any, tokenizer: Any, config: Any, processor: Any = None, max_samples: int = -1):
        self.filter_report: PromptFilterReport | None = None
        super().__init__(data_files, tokenizer, config, processor=processor, max_samples=max_samples)
        # ToolAgentLoop builds its prompt from the raw chat (kwargs["raw_prompt"]), not from input_ids.
        self.return_raw_chat = True

    def maybe_filter_out_long_prompts(self, dataframe: Any = None) -> Any:
        """Measure every prompt with the tool schema; keep those within ``max_prompt_length``.

        Always on (``data.filter_overlong_prompts`` is ignored): an overlong prompt is either an error
        mid-run (truncation=error) or a silently truncated problem (left/right).
        """
        if self.tool_schemas is None:
            if self.tool_config_path:
                logger.warning("tools from %s unavailable; measuring prompts with the built-in code_interpreter schema", self.tool_config_path)
            self.tool_schemas = [code_interpreter_tool()]
        tokenizer, tools, prompt_key = self.tokenizer, self.tool_schemas, self.prompt_key
        template_kwargs = dict(self.apply_chat_template_kwargs or {})

        def measure(doc: dict[str, Any]) -> dict[str, int]:
            # A row for the single-turn loop (the text-only baseline) is rendered without tools.
            row_tools = tools if (doc.get("agent_name") or AGENT_NAME) == AGENT_NAME else None
            try:
                return {LENGTH_COLUMN: prompt_token_count(tokenizer, doc[prompt_key], row_tools, template_kwargs)}
            except Exception:  # any template failure: the row cannot be trained on, count it
                logger.debug("prompt failed to render", exc_info=True)
                return {LENGTH_COLUMN: UNRENDERABLE}

        fingerprint = measure_fingerprint(dataframe._fingerprint, tokenizer, tools, template_kwargs, prompt_key)
        measured = dataframe.map(measure, num_proc=self.num_workers, desc="Measuring prompts with the tool schema", new_fingerprint=fingerprint)
        lengths = np.fromiter(measured[LENGTH_COLUMN], dtype=np.int64, count=len(measured))
        keep, report = filter_report(lengths, self.max_prompt_length)
        self.filter_report = report
        logger.log(logging.WARNING if report.kept < report.total else logging.INFO, "%s: %s", ", ".join(map(str, self.data_files)), report.render())
        if report.unrenderable:
            first = int(np.flatnonzero(lengths == UNRENDERABLE)[0])
            logger.warning("first prompt that failed to render (row %d): %s", first, self._render_error(measured[first][prompt_key], tools, template_kwargs))
        if report.kept == 0:
            raise ValueError(f"no prompt of {self.data_files} fits: {report.render()}")
        return measured.select(keep).remove_columns(LENGTH_COLUMN)

    def _render_error(self, messages: Any, tools: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> str:
        try:
            prompt_token_count(self.tokenizer, messages, tools, template_kwargs)
        except Exception as exc:  # reported, never raised: the row is already dropped
            return f"{type(exc).__name__}: {exc}"
        return "renders now (transient failure)"

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        if not row.get("agent_name"):
            row["agent_name"] = AGENT_NAME
        return row


if __name__ != "retool.recipe.verl_plugins.dataset":
    # Loaded by file path (verl's load_extern_type execs this file as "custom_module", a name no other
    # process can import). Hand verl the class of the importable module instead, so instances pickle
    # by reference in datasets' map workers and DataLoader workers.
    from retool.recipe.verl_plugins.dataset import RetoolRLDataset  # noqa: F401
