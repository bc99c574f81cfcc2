"""The pure parts of the one-sequence rule, on Qwen's real tokenizers: where turns end, where a call begins, how a mismatch reads."""

from __future__ import annotations

from typing import Any

import pytest

from retool.recipe.turns import call_start, first_difference, missing_turn_end, token_mismatch, turn_end_ids

IM_END, NEWLINE = 151645, 198


@pytest.fixture(params=["qwen25", "qwen3"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(request.getfixturevalue("qwen25_tokenizer" if request.param == "qwen25" else "qwen_tokenizer"))


def test_qwen_templates_close_an_assistant_turn_with_im_end_and_a_newline(tokenizer: Any) -> None:
    assert turn_end_ids(tokenizer) == [IM_END, NEWLINE]


def test_a_template_that_rewrites_assistant_content_is_refused(tokenizer: Any) -> None:
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
    with pytest.raises(ValueError, match="does not render an assistant message's content verbatim"):
        turn_end_ids(tokenizer, chat_template=template)


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        pytest.param([5, 6, IM_END], [NEWLINE], id="a turn ended by the model lacks the newline"),
        pytest.param([5, 6], [IM_END, NEWLINE], id="a turn cut short lacks the whole end"),
        pytest.param([5, IM_END, NEWLINE], [], id="a turn that already ends as the template ends it lacks nothing"),
        pytest.param([], [IM_END, NEWLINE], id="nothing generated"),
        pytest.param([NEWLINE], [IM_END, NEWLINE], id="a newline alone is not the end of a turn"),
    ],
)
def test_missing_turn_end(generated: list[int], expected: list[int]) -> None:
    assert missing_turn_end(generated, [IM_END, NEWLINE]) == expected


@pytest.mark.parametrize(
    ("before", "marker"),
    [
        pytest.param("", "<tool_call>", id="a call at token 0"),
        pytest.param("Let me compute it.\n", "<tool_call>", id="a call after a sentence"),
        pytest.param("Let me compute it.\n", "<code>", id="a marker of several tokens, found by decoding"),
    ],
)
def test_call_start_is_the_token_where_the_marker_begins(tokenizer: Any, before: str, marker: str) -> None:
    ids = tokenizer.encode(before + marker + '\n{"name": "code_interpreter"}', add_special_tokens=False)
    start = call_start(ids, tokenizer, marker)
    assert start == len(tokenizer.encode(before, add_special_tokens=False))
    assert tokenizer.decode(ids[start:]).startswith(marker)


def test_a_turn_without_a_call_has_no_call_start(tokenizer: Any) -> None:
    assert call_start(tokenizer.encode("No tool needed: 4.", add_special_tokens=False), tokenizer) is None
    assert call_start(tokenizer.encode("No tool needed: 4.", add_special_tokens=False), tokenizer, "<code>") is None


@pytest.mark.parametrize(
    ("expected", "actual", "position"),
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2], [1, 2, 3], 2), ([1, 2, 3], [1, 2], 2), ([], [], None)],
    ids=["equal", "a changed id", "one longer", "one shorter", "both empty"],
)
def test_first_difference(expected: list[int], actual: list[int], position: int | None) -> None:
    assert first_difference(expected, actual) == position


def test_a_mismatch_names_the_position_and_both_neighbourhoods(qwen_tokenizer: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer)
    template = tokenizer.encode("</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>", add_special_tokens=False)
    loop = tokenizer.encode("</tool_call><|im_end|><|im_start|>user\n<tool_response>", add_special_tokens=False)
    assert token_mismatch(template, template, tokenizer) is None
    message = token_mismatch(template, loop, tokenizer, expected_name="template", actual_name="loop")
    assert message == (
        "token sequences differ at position 2 (template: 7 ids, loop: 6 ids)\n"
        "  template: id 198; '</tool_call><|im_end|>' | '\\n<|im_start|>user\\n<tool_response>'\n"
        "  loop: id 151644; '</tool_call><|im_end|>' | '<|im_start|>user\\n<tool_response>'"
    )
