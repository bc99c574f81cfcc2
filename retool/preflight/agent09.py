"""verl 0.9.1's agent loop in this process, against the scripted model server: the 0.9 line's rl and
eval rollout path without Ray and without a GPU.

verl 0.9.1 runs rollouts in ``AgentLoopWorker`` Ray actors that ``AgentLoopManager`` creates
(``ray.remote(AgentLoopWorker)``, ``verl/experimental/agent_loop/agent_loop.py``), each given an
``LLMServerClient`` and the ``RewardLoopWorker`` handles of the ``RewardLoopManager``
(``verl/experimental/reward_loop/reward_loop.py``), as ``RayPPOTrainer.init_workers`` wires them
(``verl/trainer/ppo/ray_trainer.py``). Unlike 0.6.1's ``AgentLoopWorkerBase``, 0.9.1's
``AgentLoopWorker`` is a plain class whose constructor takes everything it calls, so here it is verl's
class itself, constructed unchanged with

- ``llm_client``: :class:`retool.preflight.scripted.ScriptedServer` (the agent loops call
  ``server_manager.generate(request_id=..., prompt_ids=..., sampling_params=..., ...)``, ``tool_agent_loop.py``
  and ``single_turn_agent_loop.py``);
- ``reward_loop_worker_handles``: one verl ``RewardLoopWorker`` built in this process (a plain class
  too; ``RewardLoopManager`` wraps it in ``ray.remote``) behind :class:`retool.preflight.scripted.LocalActor`,
  reached as verl reaches it (``handle.compute_score.remote(data)`` awaited, ``AgentLoopWorker._compute_score``).

Everything else is verl 0.9.1's code: the worker loads the tools from the rendered tool config
(``load_all_tools``), registers our agent loop from the rendered ``agent_loop_config_path``, and per
sample instantiates the loop with hydra, giving it the tools through its constructor
(``ToolListWrap``); our ``RetoolToolAgentLoop`` runs verl's state machine, the tool parser and
``ToolAgentLoop._call_tool(tool_call, tools_kwargs, agent_data)`` against the run's sandbox; then
``_agent_loop_postprocess`` (padding, masks, the reward loop's score) and ``_postprocess`` (``rm_scores``,
``reward_extra_keys``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

from retool.preflight.scripted import InProcessRolloutBase, LocalActor


class InProcessRollout09(InProcessRolloutBase):
    """:class:`retool.preflight.scripted.InProcessRolloutBase` on verl 0.9.1: verl's ``AgentLoopWorker`` with the scripted server and an in-process reward loop worker."""

    def build_worker(self) -> AgentLoopWorker:
        reward = RewardLoopWorker(self.config, None)  # no reward model: no router address (RewardLoopManager passes None)
        return AgentLoopWorker(self.config, self.server, None, [LocalActor(reward)])

    def prepare(self, prompts: DataProto) -> None:
        # AgentLoopManager.generate_sequences (verl 0.9.1) numbers the samples before chunking.
        if "priority" not in prompts.non_tensor_batch:
            prompts.non_tensor_batch["priority"] = np.arange(len(prompts), dtype=np.int64)

    def tools(self) -> list[Any]:
        return list(self.worker.tools)
