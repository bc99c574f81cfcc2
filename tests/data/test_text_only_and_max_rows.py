"""Data preparation of the text-only baseline (rows routed to verl's single-turn loop, measured
without a tool) and ``spec.data.maxRows`` (the smoke test's tiny subsets)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from retool.data import prepare_eval, prepare_rl, prepare_run, prepare_sft
from retool.data.schema import AGENT_NAME, TEXT_AGENT_NAME
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from tests.data.helpers import dapo_row, retool_row, run_document, write_parquet
from tests.data.test_dataset import SHORT, case, length, load_class, tokenizer  # noqa: F401  (fixtures)


def rows(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def write_sources(root: Path) -> dict[str, str]:
    write_parquet(root / "sft.parquet", [retool_row(question=f"Q{i}") for i in range(5)])
    write_parquet(root / "dapo.parquet", [dapo_row(f"P{i % 7}", str(i % 7)) for i in range(70)])
    write_parquet(root / "aime.parquet", [{"Problem": f"Find x{i}.", "Answer": i} for i in range(30)])
    return {name: str(root / f"{name}.parquet") for name in ("sft", "dapo", "aime")}


def document(root: Path, sources: dict[str, str], **spec: object) -> dict:
    data = {"sft": sources["sft"], "rl": sources["dapo"], "eval": [{"name": "aime_2024", "source": sources["aime"]}]}
    return run_document(root / "pvc", data, name="run", namespace="team", claim=None, **spec)


def test_text_only_rows_go_to_the_single_turn_loop_and_nothing_else_changes(tmp_path: Path) -> None:
    sources = write_sources(tmp_path)
    tool_run = parse_run(document(tmp_path / "tool", sources))
    text_run = parse_run(document(tmp_path / "text", sources, recipe="text-only", sft={"enabled": False}))
    prepare_run(tool_run)
    prepare_run(text_run)
    tool_paths, text_paths = run_paths(tool_run), run_paths(text_run)
    assert not Path(text_paths.sft_train).exists()  # no cold start on code-interleaved trajectories
    for tool_file, text_file in ((tool_paths.rl_train, text_paths.rl_train), (tool_paths.eval_set("aime_2024"), text_paths.eval_set("aime_2024"))):
        tool_rows, text_rows = rows(tool_file), rows(text_file)
        assert {r["agent_name"] for r in tool_rows} == {AGENT_NAME}
        assert {r["agent_name"] for r in text_rows} == {TEXT_AGENT_NAME}
        # Same prompts, same answers (so the reward is the same +1/-1); no tool mentioned anywhere.
        assert [({**r, "agent_name": None}) for r in tool_rows] == [({**r, "agent_name": None}) for r in text_rows]
        assert "code_interpreter" not in str(text_rows)


def test_max_rows_keeps_the_first_rows_of_every_data_set(tmp_path: Path) -> None:
    sources = write_sources(tmp_path)
    run = parse_run(document(tmp_path, sources, data={"sft": sources["sft"], "rl": sources["dapo"], "eval": [{"name": "aime_2024", "source": sources["aime"]}], "maxRows": 3}))
    summaries = prepare_run(run)
    paths = run_paths(run)
    assert len(rows(paths.sft_train)) == 3
    assert [r["reward_model"]["ground_truth"] for r in rows(paths.rl_train)] == ["0", "1", "2"]  # distinct prompts, in source order
    assert [r["reward_model"]["ground_truth"] for r in rows(paths.eval_set("aime_2024"))] == ["0", "1", "2"]
    assert all(s.counters.get("stopped_at_max_rows") == 3 for s in summaries)


@pytest.mark.parametrize("limit", [1, 7, 100])
def test_max_rows_counts_distinct_prompts_not_source_rows(tmp_path: Path, limit: int) -> None:
    """DAPO repeats every prompt: the limit is on what is written (after deduplication)."""
    source = write_parquet(tmp_path / "dapo.parquet", [dapo_row(f"P{i % 7}", str(i % 7)) for i in range(70)])
    summary = prepare_rl(str(source), str(tmp_path / "rl.parquet"), max_rows=limit)
    assert len(rows(tmp_path / "rl.parquet")) == min(limit, 7)
    assert summary.counters.get("stopped_at_max_rows") == (limit if limit <= 7 else None)


def test_max_rows_of_sft_and_eval(tmp_path: Path) -> None:
    sources = write_sources(tmp_path)
    prepare_sft(sources["sft"], str(tmp_path / "sft.parquet"), max_rows=2)
    prepare_eval(sources["aime"], str(tmp_path / "eval.parquet"), name="aime_2024", max_rows=4)
    assert len(rows(tmp_path / "sft.parquet")) == 2 and len(rows(tmp_path / "eval.parquet")) == 4


def test_text_only_prompts_are_measured_without_the_tool_schema(case, tokenizer, tmp_path: Path) -> None:  # noqa: F811
    """A prompt that fits max_prompt_length only without the tool schema is kept for the single-turn
    loop (which renders no tool) and dropped for the tool agent (which does)."""
    path, limit, _root = case
    text = tmp_path / "text.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("agent_name"), "agent_name", [[TEXT_AGENT_NAME] * table.num_rows]), text)
    config = {"max_prompt_length": limit, "truncation": "error", "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1}
    tool_set = load_class()(data_files=[str(path)], tokenizer=tokenizer, config=OmegaConf.create(config))
    text_set = load_class()(data_files=[str(text)], tokenizer=tokenizer, config=OmegaConf.create(config))
    assert (tool_set.filter_report.kept, text_set.filter_report.kept) == (2, 3)
    assert {text_set[i]["agent_name"] for i in range(len(text_set))} == {TEXT_AGENT_NAME}
    assert length(tokenizer, SHORT, tools=False) < length(tokenizer, SHORT, tools=True)
