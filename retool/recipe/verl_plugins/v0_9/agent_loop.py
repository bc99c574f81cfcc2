"""verl 0.9.1's ``ToolAgentLoop`` recording what every interpreter call did (the tool-use dynamics).

The same record as the 0.6 line (:mod:`retool.recipe.verl_plugins.agent_loop`, built by
:func:`retool.recipe.dynamics.tool_record`), on 0.9.1's interface: ``_call_tool`` receives the
sample's ``AgentData`` and the tools arrive through the constructor. One instance runs one sample
(``AgentLoopWorker._run_agent_loop`` instantiates the loop per trajectory), so per-sample state on
``self`` is safe. Nothing in the rollout changes: same prompts, tokens and masks as verl's loop.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from retool.recipe.dynamics import MALFORMED, RECORD_KEY, code_lines, tool_record
from retool.recipe.verl_plugins.agent_loop import call_code, last_line


class RetoolToolAgentLoop(ToolAgentLoop):
    """``ToolAgentLoop`` (verl 0.9.1) plus a per-response record of its interpreter calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcomes: list[str] = []
        self._lines: list[int] = []
        self._outputs: list[str] = []
        self._first_call_at: int | None = None
        self._agent_data: AgentData | None = None

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any], *args: Any, **kwargs: Any) -> AgentState:
        self._agent_data = agent_data
        return await super()._handle_generating_state(agent_data, sampling_params, *args, **kwargs)

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        if self._first_call_at is None:
            self._first_call_at = len(agent_data.response_mask)
        return await super()._handle_processing_tools_state(agent_data)

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData) -> tuple[ToolResponse, float, dict]:
        response, reward, metrics = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        # verl returns an empty dict when it could not run the tool (bad JSON, unknown name, an exception).
        outcome = metrics.get("outcome") if isinstance(metrics, dict) else None
        self._outcomes.append(str(outcome) if outcome else MALFORMED)
        self._lines.append(code_lines(call_code(tool_call)))
        self._outputs.append(last_line(response.text))
        return response, reward, metrics

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        data = self._agent_data
        # verl 0.9.1 stops a rollout once either turn limit is reached (_handle_generating_state / _handle_processing_tools_state).
        hit = data is not None and (
            bool(self.max_assistant_turns and data.assistant_turns >= self.max_assistant_turns) or bool(self.max_user_turns and data.user_turns >= self.max_user_turns)
        )
        output.extra_fields[RECORD_KEY] = tool_record(
            self._outcomes, self._lines, self._first_call_at, hit_max_turns=hit, outputs=self._outputs, response_tokens=len(output.response_ids)
        )
        return output
