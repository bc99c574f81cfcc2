"""retool.recipe.verl_plugins.dataset.RetoolRLDataset as verl loads it: by file path, on our RL parquet, with a local tokenizer."""

from __future__ import annotations

import logging
import pickle

import pytest
import yaml
from omegaconf import OmegaConf

from retool.data import prepare_rl
from retool.data.schema import AGENT_NAME, code_interpreter_tool
from tests.conftest import REPO
from tests.data.helpers import CHAT_TEMPLATE, build_tokenizer, dapo_row, write_parquet

DATASET_FILE = REPO / "retool" / "recipe" / "verl_plugins" / "dataset.py"
SHORT = "What is 2 + 3?"
FILLER = " Consider the integer part of the sum and write the value."


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def chat(question: str) -> list[dict]:
    from retool.data.schema import ANSWER_INSTRUCTION

    return [{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}]


def length(tokenizer, question: str, tools: bool) -> int:
    return len(tokenizer.apply_chat_template(chat(question), tools=[code_interpreter_tool()] if tools else None, add_generation_prompt=True))


@pytest.fixture(scope="module")
def case(tokenizer, tmp_path_factory):
    """An RL parquet with short prompts, a prompt that fits only WITHOUT the tool schema, and a long one."""
    limit = length(tokenizer, SHORT, tools=True)
    medium = SHORT
    while length(tokenizer, medium, tools=True) <= limit:
        medium += FILLER
    assert length(tokenizer, medium, tools=False) <= limit < length(tokenizer, medium, tools=True)
    root = tmp_path_factory.mktemp("dataset")
    rows = [dapo_row(SHORT, "5"), dapo_row(SHORT.replace("3", "4"), "6"), dapo_row(medium, "7"), dapo_row(SHORT + FILLER * 200, "8")]
    prepare_rl(str(write_parquet(root / "dapo.parquet", rows)), str(root / "rl.parquet"))
    return root / "rl.parquet", limit, root


def load_class(path: str = str(DATASET_FILE)):
    from verl.utils.import_utils import load_extern_type

    return load_extern_type(path, "RetoolRLDataset")


def make(case, tokenizer, **overrides):
    path, limit, root = case
    config = {"max_prompt_length": limit, "truncation": "error", "cache_dir": str(root / "cache"), "filter_overlong_prompts": False, "filter_overlong_prompts_workers": 1}
    config.update(overrides)
    return load_class()(data_files=[str(path)], tokenizer=tokenizer, config=OmegaConf.create(config))


@pytest.mark.parametrize("path", [str(DATASET_FILE), f"file://{DATASET_FILE}", "pkg://retool.recipe.verl_plugins.dataset"], ids=["file path", "file uri", "package"])
def test_verl_loads_the_importable_class(path: str) -> None:
    from retool.recipe.verl_plugins.dataset import RetoolRLDataset

    assert load_class(path) is RetoolRLDataset


@pytest.mark.parametrize("workers", [1, 2], ids=["in process", "two datasets workers"])
def test_prompts_are_measured_with_the_tool_schema_and_filtered(case, tokenizer, caplog, workers: int) -> None:
    caplog.set_level(logging.INFO, logger="retool.recipe.verl_plugins.dataset")
    dataset = make(case, tokenizer, filter_overlong_prompts_workers=workers)
    report = dataset.filter_report
    assert (report.total, report.kept, report.too_long, report.unrenderable) == (4, 2, 2, 0)
    assert len(dataset) == 2
    assert "kept 2 of 4 prompts: 2 longer than max_prompt_length" in caplog.text


def test_items_are_routed_to_the_tool_agent_with_the_raw_chat(case, tokenizer) -> None:
    from verl.utils.dataset.rl_dataset import collate_fn

    dataset = make(case, tokenizer)
    item = dataset[0]
    assert item["agent_name"] == AGENT_NAME
    assert item["raw_prompt"] == chat(SHORT)
    assert item["input_ids"].shape[0] == case[1]
    assert (item["index"], item["reward_model"]["ground_truth"]) == (0, "5")
    batch = collate_fn([dataset[0], dataset[1]])
    assert list(batch["agent_name"]) == [AGENT_NAME, AGENT_NAME]


def test_rows_without_agent_name_are_routed_too(case, tokenizer, tmp_path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(case[0]).drop_columns(["agent_name"])
    pq.write_table(table, tmp_path / "plain.parquet")
    dataset = make((tmp_path / "plain.parquet", case[1], tmp_path), tokenizer)
    assert dataset[0]["agent_name"] == AGENT_NAME


def test_the_configured_tool_schema_is_the_one_measured(case, tokenizer, tmp_path) -> None:
    """With data.tool_config_path, prompts are measured with THAT schema: a longer one filters more."""
    schema = code_interpreter_tool()
    schema["function"]["description"] = "Run Python code in a sandbox and return what it prints. " * 10
    tool_config = {"tools": [{"class_name": "verl.tools.base_tool.BaseTool", "config": {"type": "native"}, "tool_schema": schema}]}
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump(tool_config))
    # The short prompts fit max_prompt_length exactly with the built-in schema (kept 2 elsewhere); with this one none fits.
    with pytest.raises(ValueError, match="kept 0 of 4 prompts: 4 longer than max_prompt_length"):
        make(case, tokenizer, tool_config_path=str(tmp_path / "tools.yaml"))


def test_prompts_the_template_cannot_render_are_counted(case, tokenizer, caplog) -> None:
    template = "{% if '2 + 4' in messages[0].content %}{{ raise_exception('cannot render') }}{% endif %}" + CHAT_TEMPLATE
    dataset = make(case, tokenizer, apply_chat_template_kwargs={"chat_template": template})
    report = dataset.filter_report
    assert (report.kept, report.too_long, report.unrenderable) == (1, 2, 1)
    assert "first prompt that failed to render (row 1): TemplateError: cannot render" in caplog.text


def test_nothing_fits_is_an_error(case, tokenizer) -> None:
    with pytest.raises(ValueError, match=r"no prompt of .* fits: kept 0 of 4 prompts: 4 longer than max_prompt_length=10"):
        make(case, tokenizer, max_prompt_length=10)


def test_dataset_pickles_for_dataloader_workers(case, tokenizer) -> None:
    dataset = make(case, tokenizer)
    clone = pickle.loads(pickle.dumps(dataset))
    assert type(clone) is type(dataset) and clone.filter_report == dataset.filter_report


def test_the_measured_lengths_fingerprint_changes_with_everything_that_decides_them(tokenizer) -> None:
    """``Dataset.map`` is handed this fingerprint instead of dill-hashing a closure over the tokenizer (6 s a
    dataset with transformers 5): the cache of measured lengths must still be missed whenever a length could differ."""
    from retool.recipe.verl_plugins.dataset import measure_fingerprint

    tools, kwargs = [code_interpreter_tool()], {"enable_thinking": False}
    base = measure_fingerprint("abc123", tokenizer, tools, kwargs, "prompt")
    assert base is not None and len(base) == 32 and base == measure_fingerprint("abc123", build_tokenizer(), [code_interpreter_tool()], dict(kwargs), "prompt")
    other_template, added_token = build_tokenizer(), build_tokenizer()
    other_template.chat_template = CHAT_TEMPLATE.replace("<|im_start|>", "<|im_start|> ")
    added_token.add_tokens(["<think>"])
    longer = code_interpreter_tool()
    longer["function"]["description"] += " More."
    changed = {
        "another dataset": measure_fingerprint("abc124", tokenizer, tools, kwargs, "prompt"),
        "another chat template": measure_fingerprint("abc123", other_template, tools, kwargs, "prompt"),
        "an added token": measure_fingerprint("abc123", added_token, tools, kwargs, "prompt"),
        "another tool schema": measure_fingerprint("abc123", tokenizer, [longer], kwargs, "prompt"),
        "no tools": measure_fingerprint("abc123", tokenizer, None, kwargs, "prompt"),
        "other template arguments": measure_fingerprint("abc123", tokenizer, tools, {"enable_thinking": True}, "prompt"),
        "another prompt column": measure_fingerprint("abc123", tokenizer, tools, kwargs, "question"),
    }
    assert all(v != base for v in changed.values()), [k for k, v in changed.items() if v == base]
    assert len(set(changed.values())) == len(changed)


def test_a_dataset_measured_again_with_a_longer_schema_is_measured_anew_not_read_from_the_cache(case, tokenizer, tmp_path) -> None:
    """Same parquet, same cache directory: the second measurement must not reuse the first one's lengths."""
    assert make(case, tokenizer).filter_report.kept == 2
    schema = code_interpreter_tool()
    schema["function"]["description"] += " Always print the final value."
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [{"class_name": "verl.tools.base_tool.BaseTool", "config": {"type": "native"}, "tool_schema": schema}]}))
    with pytest.raises(ValueError, match="kept 0 of 4 prompts"):
        make(case, tokenizer, tool_config_path=str(tmp_path / "tools.yaml"))
