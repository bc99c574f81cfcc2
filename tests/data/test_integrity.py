"""Bad input never becomes training data: undecodable text, mostly-junk sources, files that break part-way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from retool.data import SourceError, prepare_eval, prepare_rl, prepare_sft
from retool.data.sources import iter_batches
from retool.data.writer import TooManyMalformedError
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run
from tests.conftest import REPO, repo_env
from tests.data.helpers import dapo_row, read_rows, retool_row, run_document, write_jsonl, write_parquet


def retool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retool.cli", "data", "prepare", *args], env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=120)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def jsonl(row: dict) -> bytes:
    return json.dumps(row).encode()


def test_bytes_that_are_not_utf8_make_their_row_malformed_not_a_replacement_character(tmp_path: Path) -> None:
    good = [jsonl(dapo_row(f"Problem {i}", str(i))) for i in range(40)]
    latin1 = jsonl(dapo_row("Caf\u00e9 costs 6 euros", "6")).replace(b"\\u00e9", b"\xe9").replace(b'"6"', b'"6\xb0"')
    source = write_lines(tmp_path / "dapo.jsonl", [*good[:10], latin1, *good[10:]])
    summary = prepare_rl(str(source), str(tmp_path / "rl.parquet"))
    assert (summary.rows_read, summary.rows_written, summary.malformed) == (41, 40, 1)
    assert summary.malformed_by_reason == {"not valid UTF-8": 1}
    assert summary.malformed_examples[0].where == f"{source}#11"
    assert "byte 0xe9 at column" in summary.malformed_examples[0].snippet
    rows = read_rows(tmp_path / "rl.parquet")
    assert not [r for r in rows if "\ufffd" in json.dumps(r, ensure_ascii=False)], "no U+FFFD reached a prompt or a ground truth"


def test_a_bom_and_crlf_line_ends_are_still_text(tmp_path: Path) -> None:
    source = tmp_path / "aime.jsonl"
    source.write_bytes("\ufeff".encode() + b'{"problem": "Find x.", "answer": 3}\r\n{"problem": "Find y.", "answer": 4}\r\n')
    summary = prepare_eval(str(source), str(tmp_path / "aime.parquet"), name="aime_2024")
    assert (summary.rows_written, summary.malformed) == (2, 0)


def test_an_escaped_lone_surrogate_is_malformed_not_a_crash(tmp_path: Path) -> None:
    lines = [jsonl({"problem": f"Find {i}.", "answer": i}) for i in range(30)] + [b'{"problem": "Find \\ud800.", "answer": 1}']
    summary = prepare_eval(str(write_lines(tmp_path / "aime.jsonl", lines)), str(tmp_path / "aime.parquet"), name="aime_2024")
    assert (summary.rows_written, summary.malformed_by_reason) == (30, {"not valid UTF-8": 1})


def test_text_in_a_parquet_column_that_is_not_utf8_is_malformed(tmp_path: Path) -> None:
    rows = [dapo_row(f"Problem {i}", str(i)) for i in range(30)]
    table = pa.Table.from_pylist(rows)
    truths = pa.array([b"1\xff" if i == 7 else str(i).encode() for i in range(30)], type=pa.binary()).view(pa.string())
    reward_model = pa.StructArray.from_arrays([truths, pa.array(["rule"] * 30)], names=["ground_truth", "style"])
    pq.write_table(table.set_column(table.schema.get_field_index("reward_model"), "reward_model", reward_model), tmp_path / "dapo.parquet")
    summary = prepare_rl(str(tmp_path / "dapo.parquet"), str(tmp_path / "rl.parquet"))
    assert (summary.rows_read, summary.rows_written, summary.malformed) == (30, 29, 1)
    assert summary.malformed_by_reason == {"not valid UTF-8": 1} and summary.malformed_examples[0].where.endswith("#7")


def test_a_mostly_junk_source_fails_and_publishes_nothing(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "dapo.jsonl", [jsonl(dapo_row("The only problem", "1")), *[b"<html>junk</html>"] * 5000])
    out = tmp_path / "rl.parquet"
    with pytest.raises(TooManyMalformedError, match=r"5000 of 5001 rows are malformed \(100\.0%, above the 5% limit\), so nothing was published") as err:
        prepare_rl(str(source), str(out))
    assert "invalid JSON" in str(err.value) and f"{source}#2" in str(err.value), "the reasons and the first examples are named"
    assert not out.exists() and not list(tmp_path.glob(".rl.parquet.*"))


@pytest.mark.parametrize(("limit", "published"), [(None, False), (0.2, True)], ids=["default 5% refuses 10%", "a 20% limit accepts it"])
def test_the_malformed_limit_is_configurable(tmp_path: Path, limit: float | None, published: bool) -> None:
    rows = [retool_row() for _ in range(9)] + ["{broken"]
    source = write_jsonl(tmp_path / "sft.jsonl", rows)
    options = {} if limit is None else {"max_malformed_fraction": limit}
    if published:
        assert prepare_sft(str(source), str(tmp_path / "sft.parquet"), **options).malformed == 1
    else:
        with pytest.raises(TooManyMalformedError, match="1 of 10 rows"):
            prepare_sft(str(source), str(tmp_path / "sft.parquet"), **options)
    assert (tmp_path / "sft.parquet").exists() is published


def corrupt_parquet(path: Path, rows: int = 300) -> Path:
    """A parquet file whose footer is intact but whose second row group's first page header is garbage."""
    table = pa.Table.from_pylist([{"Problem": f"Problem {i} " * 20, "Answer": str(i)} for i in range(rows)])
    pq.write_table(table, path, row_group_size=100, compression="NONE")
    offset = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 24] = b"\xff" * 24
    path.write_bytes(bytes(data))
    return path


def test_a_corrupt_parquet_page_is_a_source_error_naming_file_and_position(tmp_path: Path) -> None:
    path = corrupt_parquet(tmp_path / "aime.parquet")
    with pytest.raises(SourceError, match=rf"{path}: unreadable from row 100 \(row group 2 of 3, rows 100-199\)"):
        list(iter_batches(str(path), batch_rows=50))
    with pytest.raises(SourceError, match="row group 2 of 3"):
        prepare_eval(str(path), str(tmp_path / "aime_2024.parquet"), name="aime_2024")
    assert not (tmp_path / "aime_2024.parquet").exists()


def test_cli_exits_1_without_a_traceback_and_publishes_nothing(tmp_path: Path) -> None:
    junk = write_lines(tmp_path / "dapo.jsonl", [jsonl(dapo_row("The only problem", "1")), *[b"\xff\xfe junk"] * 200])
    result = retool("rl", "--source", str(junk), "--out", str(tmp_path / "rl.parquet"))
    assert result.returncode == 1
    assert "200 of 201 rows are malformed" in result.stderr and "not valid UTF-8" in result.stderr
    assert "Traceback" not in result.stderr

    corrupt = corrupt_parquet(tmp_path / "aime.parquet")
    result = retool("eval", "--source", str(corrupt), "--out", str(tmp_path / "aime_2024.parquet"), "--name", "aime_2024")
    assert result.returncode == 1 and "row group 2 of 3" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*_2024.parquet")) and not (tmp_path / "rl.parquet").exists()


@pytest.mark.parametrize(("limit", "code"), [(None, 1), (0.5, 0)], ids=["the spec's default refuses a junk eval set", "spec.data.maxMalformedFraction admits it"])
def test_prepare_all_publishes_every_output_or_none(tmp_path: Path, limit: float | None, code: int) -> None:
    sources = tmp_path / "sources"
    write_jsonl(sources / "sft.jsonl", [retool_row(), retool_row()])
    write_parquet(sources / "dapo.parquet", [dapo_row(f"P{i}", str(i)) for i in range(5)])
    write_jsonl(sources / "aime.jsonl", [{"problem": "Find x.", "answer": 1}, "not json", {"problem": "Find y.", "answer": 2}])
    data = {"sft": str(sources / "sft.jsonl"), "rl": str(sources / "dapo.parquet"), "eval": [{"name": "aime_2024", "source": str(sources / "aime.jsonl")}]}
    document = run_document(tmp_path / "pvc", {**data, **({} if limit is None else {"maxMalformedFraction": limit})})
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(document))
    paths = run_paths(parse_run(document))
    Path(paths.rl_train).parent.mkdir(parents=True, exist_ok=True)
    Path(paths.rl_train).write_bytes(b"the previous attempt's output")

    result = retool("all", "--spec", str(spec))
    assert result.returncode == code, result.stderr
    if code:
        assert "1 of 3 rows are malformed" in result.stderr
        assert Path(paths.rl_train).read_bytes() == b"the previous attempt's output", "the RL output that converted fine is not published either"
        assert not Path(paths.sft_train).exists() and not Path(paths.eval_set("aime_2024")).exists()
        assert not [p.name for p in Path(paths.data).rglob(".*.tmp")], "staged files are discarded"
    else:
        assert len(read_rows(Path(paths.rl_train))) == 5 and len(read_rows(Path(paths.eval_set("aime_2024")))) == 2
