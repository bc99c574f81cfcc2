"""The scripted model server and the in-process rollout both verl lines' preflight drive (line-neutral).

The rollout checks run verl's own agent-loop worker in this process, against :class:`ScriptedServer`
instead of vLLM: it replays, per problem, the turns SFT trains the model to produce
(:mod:`retool.preflight.episodes`). Everything here is what the 0.6 line (:mod:`retool.preflight.agent`,
verl 0.6.1's ``AgentLoopWorkerBase``) and the 0.9 line (:mod:`retool.preflight.agent09`, verl
0.9.1's ``AgentLoopWorker``) share: the stand-in for a Ray actor handle (:class:`LocalActor`), the
episodes and transcripts, the server, and :class:`InProcessRolloutBase`, which is
``AgentLoopManager.generate_sequences`` without Ray (the same on both lines but for the worker it
builds). It imports only what verl 0.6.1 and 0.9.1 both have (``TokenOutput`` in
``verl/workers/rollout/replica.py``, ``AgentLoopManager._performance_metrics`` and ``DataProto``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.workers.rollout.replica import TokenOutput


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

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: Mapping[str, Any], **_: Any) -> TokenOutput:
        """verl's server call (0.6.1 ``AsyncLLMServerManager.generate``, 0.9.1 ``LLMServerClient.generate``); media arguments are ignored."""
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


class InProcessRolloutBase:
    """What ``RayPPOTrainer`` calls as ``async_rollout_manager``, backed by one in-process agent-loop worker.

    ``generate_sequences`` is ``AgentLoopManager.generate_sequences`` without Ray: the batch is split
    into ``rollout.agent.num_workers`` chunks like verl splits it between its workers, the chunks run
    concurrently on one event loop, and the outputs are concatenated and timed by verl's own code.
    Use as a context manager: it owns the event loop, and closes the tools' HTTP clients.
    ``agents`` counts the samples per agent loop verl ran them with (the rows' ``agent_name``, or
    verl's ``rollout.agent.default_agent_loop`` for rows naming none).

    A line builds its worker in :meth:`build_worker` (called inside the event loop: verl's reward
    managers capture the running loop), names the tools to close in :meth:`tools`, and may add what
    its manager adds to a batch before chunking (:meth:`prepare`).
    """

    def __init__(self, config: DictConfig, server: ScriptedServer) -> None:
        self.config = config
        self.server = server
        self.agents: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self.before_build()

        async def build() -> Any:
            return self.build_worker()

        self.worker = self.loop.run_until_complete(build())

    def before_build(self) -> None:
        """Reset process state a fresh worker process would not have (nothing by default)."""

    def build_worker(self) -> Any:
        raise NotImplementedError

    def prepare(self, prompts: DataProto) -> None:
        """What the line's ``AgentLoopManager.generate_sequences`` adds to the batch before chunking (nothing by default)."""

    def tools(self) -> list[Any]:
        return []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.prepare(prompts)
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
        for tool in self.tools():
            closer = getattr(tool, "aclose", None)
            if closer is not None:
                self.loop.run_until_complete(closer())
        self.after_close()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    def after_close(self) -> None:
        """Undo :meth:`before_build` (nothing by default)."""

    def __enter__(self) -> InProcessRolloutBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
