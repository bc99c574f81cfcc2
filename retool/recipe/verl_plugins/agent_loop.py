"""verl 0.6.1's ``ToolAgentLoop`` with the interpreter-call record (:mod:`retool.recipe.verl_plugins.call_record`).

What every call did is recorded by :class:`~retool.recipe.verl_plugins.call_record.CallRecording`,
the same mixin the 0.9 line's loop uses; this module holds only what verl 0.6.1 makes different:
``_call_tool``'s and ``_handle_generating_state``'s signatures, and the end of turn below.

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

import logging
from typing import Any, ClassVar

from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from retool.recipe.turns import missing_turn_end, turn_end_ids
from retool.recipe.verl_plugins.call_record import CallRecording

logger = logging.getLogger(__name__)


class RetoolToolAgentLoop(CallRecording, ToolAgentLoop):
    """``ToolAgentLoop`` (verl 0.6.1) plus a per-response record of its interpreter calls (one instance per sample)."""

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

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False) -> AgentState:
        self._agent_data = agent_data
        return await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
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
        self._note_call(tool_call, response, metrics)
        return response, reward, metrics
