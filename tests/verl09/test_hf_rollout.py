"""The rehearsal rollout engine ``hf`` (``retool.recipe.verl_plugins.v0_9.hf_rollout``) against references from outside it.

- greedy tokens: transformers' own ``generate`` on each prompt alone (ours decodes a left-padded batch);
- log-probs: a plain forward of the model over prompt + response, through transformers' own logits
  warpers (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``) for verl's
  default ``processed_logprobs``, and without them for ``raw_logprobs``;
- the request's token budget: verl 0.9.1's vLLM server rule (``vllm_async_server.py`` ``generate``);
- the server as verl's ``LLMServerClient`` calls it: concurrent requests of two samplings, then the
  trainer's weights (``load_weights``), which must change what it generates.

The model is the rehearsal's tiny Qwen2.5 (random weights, real tokenizer), built once per session.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from verl.workers.config import HFModelConfig, RolloutConfig

from retool.recipe.verl_plugins.v0_9.hf_rollout import HFGenerationServer, Request, Sampling, generate_batch, max_new_tokens, processed_logits
from retool.rehearsal.model import GENERATION_CONFIG, build_tiny_model

pytestmark = pytest.mark.slow

PROMPTS = ("What is 2 + 2?", "Find the remainder when $2^{100}$ is divided by $7$. Think carefully and use code.", "Hi")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def model(tiny: Path):
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def prompt_ids(tiny: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False)) for p in PROMPTS]


STOPS = frozenset(GENERATION_CONFIG["eos_token_id"])


def requests(prompts: list[list[int]], sampling: Sampling, max_tokens: int = 12) -> list[Request]:
    return [Request(p, max_tokens, sampling, None) for p in prompts]  # type: ignore[arg-type]


def test_greedy_batch_equals_transformers_generate_on_each_prompt_alone(model, prompt_ids) -> None:
    assert len({len(p) for p in prompt_ids}) == len(prompt_ids), "the prompts must differ in length, so the batch is left-padded"
    out = generate_batch(model, requests(prompt_ids, Sampling(0.0, 1.0, -1, False)), STOPS, GENERATION_CONFIG["pad_token_id"], False, torch.Generator())
    for prompt, completion in zip(prompt_ids, out, strict=True):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=sorted(STOPS), pad_token_id=GENERATION_CONFIG["pad_token_id"])
        assert completion.token_ids == reference[0, len(prompt) :].tolist()
        assert completion.log_probs is None


def reference_log_probs(model, prompt: list[int], response: list[int], sampling: Sampling, raw: bool) -> list[float]:
    """log p(token) at each response position from one forward over the whole sequence, through transformers' warpers."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    if not raw:
        warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
        if sampling.top_k > 0:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        logits = torch.stack([warpers(ids[:, : len(prompt) + i], logits[i : i + 1])[0] for i in range(len(response))])
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("raw", [False, True], ids=["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize("sampling", [Sampling(1.0, 1.0, -1, True), Sampling(0.7, 0.9, -1, True), Sampling(1.3, 0.95, 50, True)], ids=["t1", "t0.7-p0.9", "t1.3-p0.95-k50"])
def test_reported_log_probs_are_the_models_own_under_the_sampler(model, prompt_ids, sampling: Sampling, raw: bool) -> None:
    out = generate_batch(model, requests(prompt_ids, sampling), STOPS, GENERATION_CONFIG["pad_token_id"], raw, torch.Generator().manual_seed(7))
    for prompt, completion in zip(prompt_ids, out, strict=True):
        assert completion.log_probs is not None and len(completion.log_probs) == len(completion.token_ids) > 0
        expected = reference_log_probs(model, prompt, completion.token_ids, sampling, raw)
        assert completion.log_probs == pytest.approx(expected, abs=2e-4)
        assert all(lp > float("-inf") for lp in completion.log_probs), "a sampled token is never one the sampler masked"


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.0, 5, 1.0), (0.8, -1, 0.5), (2.0, 20, 0.9), (1.0, -1, 1e-6)])
def test_processed_logits_equal_transformers_warpers(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(3)) * 4
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    expected = warpers(torch.zeros(3, 1, dtype=torch.long), logits.clone())
    got = processed_logits(logits, Sampling(temperature, top_p, top_k, True))
    assert torch.equal(torch.isinf(got), torch.isinf(expected)), "the same tokens are masked"
    finite = ~torch.isinf(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-5)


def rollout_config(**kwargs) -> RolloutConfig:
    return RolloutConfig(name="hf", prompt_length=kwargs.pop("prompt_length", 100), response_length=kwargs.pop("response_length", 50), **kwargs)


@pytest.mark.parametrize(
    ("params", "prompt_len", "config", "expected"),
    [
        ({}, 10, {}, 50),  # response_length
        ({}, 120, {}, 30),  # the rest of prompt + response
        ({"max_tokens": 7}, 10, {}, 7),
        ({"max_new_tokens": 9}, 10, {}, 9),  # SGLang's name
        ({"max_tokens": 0}, 10, {}, 1),  # at least one token
        ({"max_tokens": 500}, 10, {"max_model_len": 64}, 54),  # never past the model's context
        ({}, 149, {}, 1),
    ],
)
def test_token_budget_is_verl_vllm_servers(params: dict, prompt_len: int, config: dict, expected: int) -> None:
    assert max_new_tokens(params, prompt_len, rollout_config(**config)) == expected


def test_a_prompt_that_fills_the_context_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError, match=r"prompt length \(64\)"):
        max_new_tokens({}, 64, rollout_config(max_model_len=64))


def test_a_row_stops_at_its_stop_token_and_keeps_it(model, prompt_ids) -> None:
    greedy = Sampling(0.0, 1.0, -1, False)
    first = generate_batch(model, requests(prompt_ids[:1], greedy, 8), STOPS, GENERATION_CONFIG["pad_token_id"], False, torch.Generator())[0].token_ids
    stop = first[-1]
    stopped = generate_batch(model, requests(prompt_ids[:1], greedy, 8), frozenset({stop}), GENERATION_CONFIG["pad_token_id"], False, torch.Generator())[0].token_ids
    assert stopped == first[: first.index(stop) + 1], "a stop token ends the response and stays in it, as vLLM returns an EOS"


def test_the_server_batches_concurrent_requests_and_takes_the_trainers_weights(tiny: Path, prompt_ids) -> None:
    server = HFGenerationServer(rollout_config(), HFModelConfig(path=str(tiny)), replica_rank=0)
    greedy, sampled = {"temperature": 0.0, "logprobs": False, "max_tokens": 6}, {"temperature": 1.0, "top_p": 1.0, "logprobs": True, "max_tokens": 6}

    async def round_trip() -> list:
        calls = [
            server.generate(prompt_ids=p, sampling_params=dict(params), request_id=f"r{i}-{j}") for i, p in enumerate(prompt_ids) for j, params in enumerate((greedy, sampled))
        ]
        return list(await asyncio.gather(*calls))

    before = asyncio.run(round_trip())
    assert [len(o.token_ids) for o in before] == [6] * 6 or all(o.token_ids[-1] in STOPS or len(o.token_ids) == 6 for o in before)
    assert all((o.log_probs is None) == (i % 2 == 0) for i, o in enumerate(before))
    assert {o.stop_reason for o in before} == {"completed"}
    weights = {name: torch.randn_like(p) * 0.05 for name, p in server.model.named_parameters()}
    assert asyncio.run(server.load_weights(weights, global_steps=3)) == len(weights)
    after = asyncio.run(round_trip())
    assert after[0].extra_fields["global_steps"] == 3
    assert [o.token_ids for o in after[0::2]] != [o.token_ids for o in before[0::2]], "new weights must change what greedy decoding gives"


def test_weights_the_model_has_not_or_weights_missing_are_refused_by_name(tiny: Path) -> None:
    server = HFGenerationServer(rollout_config(), HFModelConfig(path=str(tiny)), replica_rank=0)
    weights = {name: p.detach().clone() for name, p in server.model.named_parameters()}
    with pytest.raises(KeyError, match=r"model\.not_a_layer\.weight"):
        asyncio.run(server.load_weights({**weights, "model.not_a_layer.weight": torch.zeros(1)}))
    missing = next(iter(weights))
    with pytest.raises(KeyError, match=re.escape(missing)):
        asyncio.run(server.load_weights({k: v for k, v in weights.items() if k != missing}))
