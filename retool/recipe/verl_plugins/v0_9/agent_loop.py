"""verl 0.9.1's ``ToolAgentLoop`` with the interpreter-call record (:mod:`retool.recipe.verl_plugins.call_record`).

The record is the 0.6 line's, made by the same mixin
(:class:`~retool.recipe.verl_plugins.call_record.CallRecording`); this module holds only what verl
0.9.1 makes different: ``_call_tool`` receives the sample's ``AgentData``, and
``_handle_generating_state`` takes extra arguments. Nothing in the rollout changes: same prompts,
tokens and masks as verl's loop (verl 0.9.0 writes the chat template's end of turn before a tool
turn itself, which the 0.6 line's loop has to put back).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from retool.recipe.verl_plugins.call_record import CallRecording


class RetoolToolAgentLoop(CallRecording, ToolAgentLoop):
    """``ToolAgentLoop`` (verl 0.9.1) plus a per-response record of its interpreter calls."""

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any], *args: Any, **kwargs: Any) -> AgentState:
        self._agent_data = agent_data
        return await super()._handle_generating_state(agent_data, sampling_params, *args, **kwargs)

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData) -> tuple[ToolResponse, float, dict]:
        response, reward, metrics = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        self._note_call(tool_call, response, metrics)
        return response, reward, metrics
