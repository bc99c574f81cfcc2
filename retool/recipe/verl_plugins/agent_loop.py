"""verl 0.6.1's ``ToolAgentLoop``, recording what every interpreter call did, for the tool-use dynamics.

verl's tool agent loop keeps no account of its tool calls: ``_handle_processing_tools_state`` drops
the metrics dict each tool returns, and the output carries only turn counts. This subclass changes
nothing in the rollout (same prompts, same tokens, same masks) and adds one extra field per
response, ``retool_tools`` (:func:`retool.recipe.dynamics.tool_record`): each call's outcome (the
name our code-interpreter tool reports, or ``malformed`` when verl could not hand the call to the
tool), its lines of code, the response tokens generated before the first call, whether the loop
stopped at ``maxTurns``, and the last line of each call's output. verl's ``_postprocess`` turns
extra fields into ``non_tensor_batch`` columns, so the record reaches the trainer with the batch.

The first call's position is where the call *begins*: response tokens before its ``<tool_call>``
token (the paper's code invocation timing), not where verl's turn containing it ends.

One change to the rollout's tokens, so that RL trains on the sequence SFT trained on and evaluation
shows: verl 0.6.1 appends the tool turn right after the model's ``<|im_end|>``, without the newline
Qwen's chat template writes there (:mod:`retool.recipe.turns`). This loop inserts what the model did
not generate of the template's end of turn (``\n``; all of ``<|im_end|>\n`` after a turn cut short)
before each tool turn, masked out like the tool turn itself, and counts it against
``response_length`` as verl counts the tool turn.

It is registered under verl's own name ``tool_agent`` through ``rollout.agent.agent_loop_config_path``
(:data:`AGENT_LOOP_CONFIG`): the prepared rows and ``default_agent_loop`` keep naming ``tool_agent``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from retool.recipe.dynamics import MALFORMED, RECORD_KEY, code_lines, tool_record
from retool.recipe.turns import call_start, missing_turn_end, turn_end_ids

logger = logging.getLogger(__name__)

MAX_OUTPUT_LINE_CHARS = 200


def last_line(text: str | None) -> str:
    """The last non-blank line of a tool output, cut to ``MAX_OUTPUT_LINE_CHARS``."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            return line.strip()[:MAX_OUTPUT_LINE_CHARS]
    return ""


def call_code(call: FunctionCall) -> Any:
    """The ``code`` argument of a parsed call, or None when its arguments are not a JSON object."""
    try:
        arguments = json.loads(call.arguments)
    except (TypeError, ValueError):
        return None
    return arguments.get("code") if isinstance(arguments, dict) else None


class RetoolToolAgentLoop(ToolAgentLoop):
    """``ToolAgentLoop`` plus a per-response record of its interpreter calls (one instance per sample)."""

    turn_end: ClassVar[list[int]] = []
    """The ids the chat template closes an assistant message with (set once per worker, with verl's class state)."""

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
        initialized = cls._class_initialized
        super().init_class(config, tokenizer, processor, **kwargs)
        if not initialized:
            try:
                cls.turn_end = turn_end_ids(tokenizer, **cls.apply_chat_template_kwargs)
            except ValueError as exc:  # a template we cannot read the end of a turn from: verl's sequence, unchanged
                logger.warning("tool turns follow the model's last token as verl 0.6.1 appends them: %s", exc)
                cls.turn_end = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcomes: list[str] = []
        self._lines: list[int] = []
        self._outputs: list[str] = []
        self._first_call_at: int | None = None
        self._agent_data: AgentData | None = None

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False) -> AgentState:
        self._agent_data = agent_data
        return await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        if self._first_call_at is None:
            # agent_data.response_ids is the turn just generated, the last of the response so far.
            turn = agent_data.response_ids
            marker = getattr(self.tool_parser, "tool_call_start_token", "<tool_call>")
            start = call_start(turn, self.tokenizer, marker)
            self._first_call_at = len(agent_data.response_mask) - len(turn) + (start if start is not None else 0)
        before = (len(agent_data.prompt_ids), len(agent_data.response_mask), len(agent_data.response_logprobs), agent_data.user_turns)
        state = await super()._handle_processing_tools_state(agent_data)
        if agent_data.user_turns == before[3]:
            return state  # verl appended no tool turn (it stopped at response_length)
        separator = missing_turn_end(agent_data.prompt_ids[: before[0]], self.turn_end)
        if not separator:
            return state
        if len(agent_data.response_mask) + len(separator) >= self.response_length:
            # verl's own rule, with the separator counted: a tool turn that does not fit ends the rollout.
            del agent_data.prompt_ids[before[0] :], agent_data.response_mask[before[1] :], agent_data.response_logprobs[before[2] :]
            agent_data.user_turns = before[3]
            return AgentState.TERMINATED
        agent_data.prompt_ids[before[0] : before[0]] = separator
        agent_data.response_mask[before[1] : before[1]] = [0] * len(separator)
        if agent_data.response_logprobs:
            agent_data.response_logprobs[before[2] : before[2]] = [0.0] * len(separator)
        return state

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any]) -> tuple[ToolResponse, float, dict]:
        response, reward, metrics = await super()._call_tool(tool_call, tools_kwargs)
        # verl returns an empty dict when it could not run the tool (bad JSON, unknown name).
        outcome = metrics.get("outcome") if isinstance(metrics, dict) else None
        self._outcomes.append(str(outcome) if outcome else MALFORMED)
        self._lines.append(code_lines(call_code(tool_call)))
        self._outputs.append(last_line(response.text))
        return response, reward, metrics

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        data = self._agent_data
        # verl stops a rollout once either turn limit is reached (_handle_generating_state).
        hit = data is not None and (
            bool(self.max_assistant_turns and data.assistant_turns >= self.max_assistant_turns) or bool(self.max_user_turns and data.user_turns >= self.max_user_turns)
        )
        output.extra_fields[RECORD_KEY] = tool_record(
            self._outcomes, self._lines, self._first_call_at, hit_max_turns=hit, outputs=self._outputs, response_tokens=len(output.response_ids)
        )
        return output
