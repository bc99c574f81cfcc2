"""retool validate reads YAML as kubectl does (sigs.k8s.io/yaml v1.6.0 over go.yaml.in/yaml/v2 v2.4.3).

Each expected value below is what go-yaml v2's ``resolve`` (resolve.go) and sigs.k8s.io/yaml's JSON
conversion (yaml.go) give; tests/e2e/test_examples_apply.py checks the same against the real kubectl.
"""

from __future__ import annotations

import pytest
import yaml

from retool.spec.kubeyaml import KubeYAMLError
from retool.spec.validate import load_documents, validate_text
from tests.conftest import EXAMPLES

CASES = [
    ("y", True), ("Y", True), ("n", False), ("N", False), ("yes", True), ("off", False), ("ON", True),
    ("~", None), ("null", None), ("", None),
    ("0o17", 15), ("0O17", 15), ("017", 15), ("0x1F", 31), ("0b101", 5), ("-0b101", -5), ("1_000", 1000), ("+12", 12),
    ("1:30", "1:30"), ("190:20:30", "190:20:30"),
    ("1e-5", 1e-5), ("1.5e3", 1500), ("08", 8), (".5", 0.5), ("1.", 1), ("1e400", "1e400"), ("1.5", 1.5),
    ("2026-01-02", "2026-01-02"), ("0x", "0x"), ("yEs", "yEs"), ("nO", "nO"), ("1_2.5", 12.5),
    ("18446744073709551615", 18446744073709551615), ("-9223372036854775809", -9223372036854775808),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[f"{t or 'empty'} reads as {e!r}" for t, e in CASES])
def test_a_plain_value_reads_as_go_yaml_v2_reads_it(text, expected):
    (document,) = load_documents(f"value: {text}\n")
    assert document == {"value": expected}
    assert type(document["value"]) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("n: 1", {"false": 1}), ("y: 1", {"true": 1}), ("on: 1", {"true": 1}), ("1: 1", {"1": 1}), ("0o10: 1", {"8": 1}),
     ("1.5: 1", {"1.5": 1}), ("0.1: 1", {"0.1": 1}), ("'n': 1", {"n": 1})],
    ids=["n", "y", "on", "an integer", "an octal", "a float", "a float32-rounded float", "a quoted n"],
)
def test_a_key_becomes_the_string_the_api_server_receives(text, expected):
    assert load_documents(text) == [expected]


def test_a_null_key_is_refused_as_sigs_k8s_io_yaml_refuses_it():
    with pytest.raises(KubeYAMLError, match=r"^spec: unsupported map key None"):
        load_documents("spec:\n  ~: 1\n")


@pytest.mark.parametrize("text", ["'n'", '"y"', "!!str on"], ids=["single-quoted", "double-quoted", "tagged str"])
def test_a_quoted_word_stays_a_string(text):
    assert load_documents(f"value: {text}") == [{"value": text.strip("'\"").removeprefix("!!str ")}]


@pytest.mark.parametrize("text", [".nan", ".inf", "-.Inf"])
def test_a_value_json_cannot_carry_is_refused(text):
    with pytest.raises(KubeYAMLError, match=r"^a\.b: .* cannot be sent to the API server"):
        load_documents(f"a:\n  b: {text}\n")


@pytest.mark.parametrize("key", ["n", "N", "'n'", "false", "no", "off"])
def test_the_former_eval_n_is_refused_naming_the_new_key(key):
    text = EXAMPLES[0].read_text() + f"\n  eval:\n    {key}: 4\n"
    count, problems = validate_text(text, "run.yaml")
    assert count == 1
    (problem,) = problems
    assert problem.problem.path == "spec.eval"
    assert "renamed to eval.samplesPerProblem: write `samplesPerProblem: 4`" in problem.problem.message


def test_samples_per_problem_is_accepted():
    text = EXAMPLES[0].read_text() + "\n  eval:\n    samplesPerProblem: 4\n"
    assert validate_text(text, "run.yaml") == (1, [])


def test_an_unquoted_timestamp_is_a_string_not_a_date():
    assert yaml.safe_load("d: 2026-01-02")["d"] != "2026-01-02"  # PyYAML alone would make it a date
    assert load_documents("d: 2026-01-02") == [{"d": "2026-01-02"}]
