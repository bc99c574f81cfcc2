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

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorkerBase, AsyncLLMServerManager, _agent_loop_registry
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.agent_loop.utils import resolve_config_path
from verl.experimental.reward import RewardManagerWorker
from verl.utils import hf_processor, hf_tokenizer
from verl.utils.fs import copy_to_local
from verl.workers.rollout.replica import TokenOutput

logger = logging.getLogger(__name__)


class _RemoteMethod:
    def __init__(self, method: Any) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self._method(*args, **kwargs)
        if inspect.isawaitable(result):
            return result
        future = asyncio.get_running_loop().create_future()
        future.set_result(result)
        return future


class LocalActor:
    """An object behind the interface verl uses for an actor handle: ``handle.f.remote(...)`` is awaitable."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def __getattr__(self, name: str) -> _RemoteMethod:
        return _RemoteMethod(getattr(self.instance, name))


@dataclass(frozen=True)
class Episode:
    """What the scripted model says for one problem: a tool call, then the answer it read from the
    tool; or, in a text-only run, the answer alone.

    ``turns`` are token ids of the assistant turns exactly as the SFT dataset trains them (through
    the end-of-turn token); ``expected_tool_output`` is what the sandbox prints for the tool call
    (None without a tool).
    """

    question: str
    ground_truth: str
    turns: tuple[tuple[int, ...], ...]
    expected_tool_output: str | None


@dataclass
class Transcript:
    """What one request went through, for the report and for checks on the rollout."""

    question: str | None = None
    prompt_tokens: int = 0
    turns: int = 0
    tool_turn_texts: list[str] = field(default_factory=list)
    tool_output_seen: bool | None = None
    reply_tokens: list[int] = field(default_factory=list)
    """Tokens of each scripted model turn (the response budget they used)."""


class ScriptedServer:
    """Stands in for a vLLM server: replays an :class:`Episode` per request, keyed by the question in the prompt.

    The first turn of a request is the episode's first (the tool call, or a text-only episode's
    answer); every later turn is the final answer when the tool turn the agent loop appended holds
    the sandbox's expected output, else an answer saying it did not (the reward then scores -1 and
    the rollout check shows what the tool turn held).
    """

    def __init__(self, tokenizer: Any, episodes: Sequence[Episode], *, missing_output_turn: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        # Longest question first: one prompt's text may end with another, shorter question.
        self.episodes = sorted(episodes, key=lambda e: len(e.question), reverse=True)
        self.missing_output_turn = tuple(missing_output_turn)
        self.transcripts: dict[str, Transcript] = {}
        self._state: dict[str, tuple[Episode, list[int]]] = {}

    def _episode_for(self, prompt_text: str) -> Episode:
        for episode in self.episodes:
            if episode.question in prompt_text:
                return episode
        raise LookupError(f"no scripted episode for the prompt ending {prompt_text[-200:]!r}")

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any], image_data: Any = None) -> TokenOutput:
        transcript = self.transcripts.setdefault(request_id, Transcript())
        if request_id not in self._state:
            episode = self._episode_for(self.tokenizer.decode(prompt_ids))
            transcript.question = episode.question
            transcript.prompt_tokens = len(prompt_ids)
            reply = list(episode.turns[0])
            self._state[request_id] = (episode, list(prompt_ids) + reply)
        else:
            episode, seen = self._state[request_id]
            tool_text = self.tokenizer.decode(prompt_ids[len(seen) :])
            transcript.tool_turn_texts.append(tool_text)
            transcript.tool_output_seen = episode.expected_tool_output is not None and episode.expected_tool_output in tool_text
            reply = list(episode.turns[min(transcript.turns, len(episode.turns) - 1)] if transcript.tool_output_seen else self.missing_output_turn)
            self._state[request_id] = (episode, list(prompt_ids) + reply)
        transcript.turns += 1
        transcript.reply_tokens.append(len(reply))
        return TokenOutput(token_ids=reply, log_probs=None)


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


class InProcessRollout:
    """What ``RayPPOTrainer`` calls as ``async_rollout_manager``, backed by one in-process worker.

    ``generate_sequences`` is ``AgentLoopManager.generate_sequences`` without Ray: the batch is split
    into ``rollout.agent.num_workers`` chunks like verl splits it between its workers, the chunks run
    concurrently on one event loop, and the outputs are concatenated and timed by verl's own code.
    Use as a context manager: it owns the event loop, and closes the tools' HTTP clients.
    ``agents`` counts the samples per agent loop verl ran them with (the rows' ``agent_name``, or
    verl's ``rollout.agent.default_agent_loop`` for rows naming none).
    """

    def __init__(self, config: DictConfig, server: ScriptedServer) -> None:
        self.config = config
        self.server = server
        self.agents: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        # verl initialises the tool agent loop's class state (tools, parser, limits) once per worker
        # process; every InProcessRollout stands for a fresh worker, so it starts uninitialised.
        for loop_class in tool_loop_classes():
            loop_class._class_initialized = False
        server_manager = AsyncLLMServerManager(config, [LocalActor(server)])

        async def build() -> InProcessAgentLoopWorker:
            return InProcessAgentLoopWorker(config, server_manager, LocalActor(reward_worker(config)))

        self.worker = self.loop.run_until_complete(build())

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        chunks = prompts.chunk(self.config.actor_rollout_ref.rollout.agent.num_workers)

        async def run_all() -> list[DataProto]:
            return list(await asyncio.gather(*(self.worker.generate_sequences(chunk) for chunk in chunks)))

        outputs = self.loop.run_until_complete(run_all())
        for chunk in chunks:  # verl's worker has set every chunk's agent_name by now
            self.agents.update(str(name) for name in chunk.non_tensor_batch["agent_name"])
        output = DataProto.concat(outputs)
        metrics = [chunk_output.meta_info.pop("metrics") for chunk_output in outputs]
        timing = AgentLoopManager._performance_metrics(self, metrics, output)
        output.meta_info = {"timing": timing, **outputs[0].meta_info}
        return output

    def close(self) -> None:
        for loop_class in tool_loop_classes():
            tools = loop_class.__dict__.get("tools", {}) if loop_class.__dict__.get("_class_initialized") else {}
            for tool in tools.values():
                closer = getattr(tool, "aclose", None)
                if closer is not None:
                    self.loop.run_until_complete(closer())
            loop_class._class_initialized = False
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def __enter__(self) -> InProcessRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
