"""What every interpreter call of one trajectory did: the one recorder both verl lines' agent loops use.

verl's ``ToolAgentLoop`` keeps no account of its tool calls (``_handle_processing_tools_state`` drops
the metrics dict each tool returns; the output carries only turn counts). :class:`CallRecording` is a
mixin placed before verl's ``ToolAgentLoop`` in each line's loop class; it adds one extra field per
response, ``retool_tools`` (:func:`retool.recipe.dynamics.tool_record`), and changes nothing in the
rollout. verl's ``_postprocess`` turns extra fields into ``non_tensor_batch`` columns, so the record
reaches the trainer with the batch.

Everything the record holds is decided here, once, for both lines:

- each call's outcome: the name our code-interpreter tool reports, or ``malformed`` when verl could
  not hand the call to the tool (arguments not JSON, an unknown tool name: verl returns an empty
  metrics dict, ``_call_tool`` in both 0.6.1 and 0.9.1);
- its lines of code: the code the tool runs (:func:`retool.recipe.dynamics.code_lines`: a fenced
  block's fence lines are not code);
- where the first call *begins*: response tokens before its ``<tool_call>`` token (the paper's code
  invocation timing), not where verl's turn containing it ends;
- whether the loop stopped at ``maxTurns``, and the last line of each call's output.

Where the lines differ is only the shape of two verl methods: ``_call_tool`` takes the sample's
``AgentData`` on 0.9.1 and not on 0.6.1, and ``_handle_generating_state``'s extra arguments. Each
line's loop overrides those two with its signature and calls :meth:`CallRecording._note_call` and
keeps ``self._agent_data``; the mixin's ``_handle_processing_tools_state`` and ``run`` have the same
signature in both versions (``verl/experimental/agent_loop/tool_agent_loop.py``, 0.6.1 and 0.9.1).

Why ``agent_data.response_ids`` is the turn just generated: both versions set it to the model's
output tokens in ``_handle_generating_state`` and append those tokens at the end of the response
(0.6.1 extends ``response_mask`` by them; 0.9.1's continuous-token builder merges them at the end
and aligns the mask), so the turn starts ``len(turn)`` tokens before the response's end when the
loop reaches ``_handle_processing_tools_state``.
"""

from __future__ import annotations

import json
from typing import Any

from retool.recipe.dynamics import MALFORMED, RECORD_KEY, code_lines, tool_record
from retool.recipe.turns import call_start

MAX_OUTPUT_LINE_CHARS = 200


def last_line(text: str | None) -> str:
    """The last non-blank line of a tool output, cut to ``MAX_OUTPUT_LINE_CHARS``."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            return line.strip()[:MAX_OUTPUT_LINE_CHARS]
    return ""


def call_code(call: Any) -> Any:
    """The ``code`` argument of a parsed call (verl's ``FunctionCall``), or None when its arguments are not a JSON object."""
    try:
        arguments = json.loads(call.arguments)
    except (TypeError, ValueError):
        return None
    return arguments.get("code") if isinstance(arguments, dict) else None


class CallRecording:
    """Mixin for verl's ``ToolAgentLoop`` (put it first among the bases): a per-response record of its interpreter calls.

    One instance runs one sample (``AgentLoopWorker._run_agent_loop`` instantiates the loop per
    trajectory on both lines), so per-sample state on ``self`` is safe.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcomes: list[str] = []
        self._lines: list[int] = []
        self._outputs: list[str] = []
        self._first_call_at: int | None = None
        self._agent_data: Any = None

    def _note_first_call(self, agent_data: Any) -> None:
        if self._first_call_at is not None:
            return
        turn = agent_data.response_ids
        marker = getattr(self.tool_parser, "tool_call_start_token", "<tool_call>")
        start = call_start(turn, self.tokenizer, marker)
        self._first_call_at = len(agent_data.response_mask) - len(turn) + (start if start is not None else 0)

    def _note_call(self, tool_call: Any, response: Any, metrics: Any) -> None:
        outcome = metrics.get("outcome") if isinstance(metrics, dict) else None
        self._outcomes.append(str(outcome) if outcome else MALFORMED)
        self._lines.append(code_lines(call_code(tool_call)))
        self._outputs.append(last_line(getattr(response, "text", None)))

    async def _handle_processing_tools_state(self, agent_data: Any) -> Any:
        self._note_first_call(agent_data)
        return await super()._handle_processing_tools_state(agent_data)

    def _hit_max_turns(self) -> bool:
        """Whether the loop stopped at a turn limit (verl's own tests in ``_handle_generating_state``, both lines)."""
        data = self._agent_data
        if data is None:
            return False
        return bool(self.max_assistant_turns and data.assistant_turns >= self.max_assistant_turns) or bool(self.max_user_turns and data.user_turns >= self.max_user_turns)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        output = await super().run(sampling_params, **kwargs)
        output.extra_fields[RECORD_KEY] = tool_record(
            self._outcomes, self._lines, self._first_call_at, hit_max_turns=self._hit_max_turns(), outputs=self._outputs, response_tokens=len(output.response_ids)
        )
        return output
