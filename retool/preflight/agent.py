"""verl's agent loop in this process, against a scripted model server: the rl and eval stages'
rollout path without Ray and without a GPU.

verl 0.6.1 runs rollouts in ``AgentLoopWorker`` Ray actors. Each loads the tokenizer, starts a
``RewardManagerWorker`` actor (the reward loop) and, for every sample, runs the agent loop the
row names (``tool_agent``; ``single_turn_agent`` in a text-only run), which asks vLLM servers for
tokens through ``AsyncLLMServerManager``.
Here the worker is verl's ``AgentLoopWorkerBase`` whose constructor differs from verl's only where
verl calls Ray: the reward worker is verl's own ``RewardManagerWorker`` class built in this process,
and the server behind verl's ``AsyncLLMServerManager`` is :class:`ScriptedServer`. Everything in
between is verl's code: ``generate_sequences`` and ``_postprocess``, the agent loop (the tool agent
loop's state machine, the tool parser and the tool registry, or the single-turn loop), the reward
loop manager, padding and ``rm_scores``.

Both stand-ins are reached the way verl reaches actors (``handle.method.remote(...)`` awaited),
through :class:`LocalActor`, so the calling code is verl's unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopWorkerBase, AsyncLLMServerManager, _agent_loop_registry
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.agent_loop.utils import resolve_config_path
from verl.experimental.reward import RewardManagerWorker
from verl.utils import hf_processor, hf_tokenizer
from verl.utils.fs import copy_to_local

from retool.preflight.scripted import Episode, InProcessRolloutBase, LocalActor, ScriptedServer, Transcript

__all__ = ["Episode", "InProcessAgentLoopWorker", "InProcessRollout", "LocalActor", "ScriptedServer", "Transcript", "reward_worker"]

logger = logging.getLogger(__name__)


def reward_worker(config: DictConfig) -> Any:
    """verl's ``RewardManagerWorker`` built in this process (call inside the running event loop:
    verl's reward loop managers capture it)."""
    worker_class = RewardManagerWorker.__ray_actor_class__
    return worker_class(config, None)


class InProcessAgentLoopWorker(AgentLoopWorkerBase):
    """``AgentLoopWorkerBase`` of verl 0.6.1, constructed without Ray.

    The constructor repeats verl's line for line except: the server manager is given (verl's own
    hook, ``if not hasattr(self, "server_manager")``), the reward worker is a :class:`LocalActor`
    around verl's class instead of a Ray actor, and rollout tracing stays off (it is process-global,
    and a preflight must not write traces into the run's experiment).
    """

    def __init__(self, config: DictConfig, server_manager: AsyncLLMServerManager, reward: LocalActor) -> None:
        self.config = config
        self.server_manager = server_manager
        self.reward_router_address = None
        model_path = config.actor_rollout_ref.model.path
        self.model_name = "/".join(model_path.split("/")[-2:])
        local_path = copy_to_local(model_path)
        self.tokenizer = hf_tokenizer(local_path, trust_remote_code=True)
        self.processor = hf_processor(local_path, trust_remote_code=True)
        agent_loop_config_path = config.actor_rollout_ref.rollout.agent.agent_loop_config_path
        if agent_loop_config_path:
            for agent_loop_config in OmegaConf.load(resolve_config_path(agent_loop_config_path)):
                _agent_loop_registry[agent_loop_config.name] = agent_loop_config
        if config.actor_rollout_ref.model.get("custom_chat_template", None) is not None:
            if self.processor is not None:
                self.processor.chat_template = config.actor_rollout_ref.model.custom_chat_template
            self.tokenizer.chat_template = config.actor_rollout_ref.model.custom_chat_template
        self.reward_manager_worker = reward


def tool_loop_classes() -> list[type]:
    """verl's ``ToolAgentLoop`` and its subclasses (ours records tool calls): each keeps its own class state."""
    found, todo = [], [ToolAgentLoop]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


class InProcessRollout(InProcessRolloutBase):
    """:class:`retool.preflight.scripted.InProcessRolloutBase` on verl 0.6.1: one :class:`InProcessAgentLoopWorker`."""

    def before_build(self) -> None:
        # verl initialises the tool agent loop's class state (tools, parser, limits) once per worker
        # process; every InProcessRollout stands for a fresh worker, so it starts uninitialised.
        for loop_class in tool_loop_classes():
            loop_class._class_initialized = False

    def build_worker(self) -> InProcessAgentLoopWorker:
        server_manager = AsyncLLMServerManager(self.config, [LocalActor(self.server)])
        return InProcessAgentLoopWorker(self.config, server_manager, LocalActor(reward_worker(self.config)))

    def tools(self) -> list[Any]:
        found = []
        for loop_class in tool_loop_classes():
            if loop_class.__dict__.get("_class_initialized"):
                found.extend(loop_class.__dict__.get("tools", {}).values())
        return found

    def after_close(self) -> None:
        for loop_class in tool_loop_classes():
            loop_class._class_initialized = False
