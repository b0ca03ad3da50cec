"""Reference sampler vs HF's logits processors, plus seeding, min_tokens and validation."""

import pytest
import torch
from helpers.single_request import Sampler
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omniwalk.errors import InvalidRequestError
from omniwalk.sampling import SamplingParams

EOS = 7
VOCAB = 500


def logits(seed=0):
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    "temperature,top_k,top_p,penalty",
    [(0.7, 0, 1.0, 1.0), (1.3, 40, 1.0, 1.2), (0.9, 0, 0.8, 1.0), (1.0, 25, 0.6, 0.8)],
)
def test_processed_scores_equal_hf_processors(temperature, top_k, top_p, penalty):
    history = [3, 9, 9, 120, 400]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty)
    ours = Sampler(params, (EOS,), history).processed(logits())
    ids, hf = torch.tensor([history]), logits()[None].clone()
    chain = [RepetitionPenaltyLogitsProcessor(penalty), TemperatureLogitsWarper(temperature)]
    chain += [TopKLogitsWarper(top_k)] if top_k else []
    chain += [TopPLogitsWarper(top_p)] if top_p < 1 else []
    for proc in chain:
        hf = proc(ids, hf)
    assert torch.equal(torch.isinf(ours), torch.isinf(hf[0]))
    assert torch.allclose(ours[~torch.isinf(ours)], hf[0][~torch.isinf(hf[0])], atol=1e-5)


def test_greedy_is_argmax_and_min_tokens_masks_eos():
    x = logits()
    x[EOS] = 100.0
    sampler = Sampler(SamplingParams(temperature=0.0, min_tokens=2, max_tokens=5), (EOS,), [1, 2])
    runner_up = int(x.masked_fill(torch.arange(VOCAB) == EOS, -1e9).argmax())
    assert [sampler(x).token_id for _ in range(3)] == [runner_up, runner_up, EOS]


def test_stop_token_ids_and_ignore_eos():
    s = Sampler(SamplingParams(stop_token_ids=[11], ignore_eos=True), (EOS,), [])
    assert s.is_stop_token(11) and not s.is_stop_token(EOS)


def test_same_seed_same_tokens_and_logprobs():
    params = SamplingParams(temperature=1.0, seed=3, logprobs=True, top_logprobs=2)
    a = [Sampler(params, (EOS,), []) for _ in range(2)]
    picks = [[s(logits(i)) for i in range(20)] for s in a]
    assert [p.token_id for p in picks[0]] == [p.token_id for p in picks[1]]
    lp = torch.log_softmax(logits(0), -1)
    assert abs(picks[0][0].logprob - lp[picks[0][0].token_id].item()) < 1e-6
    assert [t for t, _ in picks[0][0].top] == lp.topk(2).indices.tolist()
    other = Sampler(SamplingParams(temperature=1.0, seed=4), (EOS,), [])
    assert [other(logits(i)).token_id for i in range(20)] != [p.token_id for p in picks[0]]


def test_sampling_follows_the_distribution():
    x = torch.tensor([0.0, 1.0, 2.0])
    s = Sampler(SamplingParams(temperature=1.0, seed=0), (EOS,), [])
    counts = torch.bincount(torch.tensor([s(x).token_id for _ in range(3000)]), minlength=3).float() / 3000
    assert torch.allclose(counts, torch.softmax(x, -1), atol=0.03)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_params_are_typed_errors(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kwargs)


def test_from_request_ignores_other_keys_and_normalises_stop():
    p = SamplingParams.from_request({"messages": [], "stop": "END", "seed": None, "max_tokens": 3})
    assert p.stop == ("END",) and p.seed is None and p.max_tokens == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": 0.7, "seed": 3},
        {"temperature": 1.0, "top_k": 5, "seed": 4},
        {"temperature": 0.9, "top_p": 0.8, "seed": 5},
        {"temperature": 0.8, "top_k": 7, "top_p": 0.5, "repetition_penalty": 1.3, "seed": 6},
        {"temperature": 0.0, "repetition_penalty": 1.2, "min_tokens": 3},
    ],
)
def test_graph_sampling_inputs_give_exactly_the_eager_draw(kwargs):
    """A CUDA graph samples from static buffers holding every ``BatchParams`` field, the ones the
    eager path leaves out set to their neutral pad values, in a batch padded to its bucket; that
    must give the same scores and ids, bit for bit, as the eager path that skips unused steps."""
    from dataclasses import fields

    from omniwalk.engine.cuda_graphs import fill_static
    from omniwalk.models.qwen3_omni.programs.talker_program import _sampling_inputs
    from omniwalk.sampling import BatchParams, SamplerState, draw, process_tensors

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    rows = [SamplingParams(**kwargs), SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, seed=9)]
    states = [SamplerState(p, (7,), [1, 2, 3]) for p in rows]
    specs = _sampling_inputs(50)
    static = {name: torch.full((4, *spec.shape), 3, dtype=spec.dtype) for name, spec in specs.items()}  # stale
    for step in range(4):
        eager = BatchParams.of(states, 50, "cpu")
        fill_static(static, specs, {f.name: getattr(eager, f.name) for f in fields(BatchParams)}, 3)
        graph = BatchParams(**static)
        padded = torch.cat([logits, logits[:1]])
        assert torch.equal(process_tensors(logits, eager), process_tensors(padded, graph)[:3])
        ids = draw(logits, eager)
        assert torch.equal(ids, draw(padded, graph)[:3])
        for s, token in zip(states, ids.tolist(), strict=True):
            if s.seen is not None:
                s.seen[token] = True
            s.num_generated += 1
        logits = logits.roll(step + 1, dims=1)


def test_gumbel_noise_is_finite_at_the_extreme_bits():
    """u = (bits + 0.5) / 2^23 stays inside (0, 1) in fp32 (with 24 bits the top value rounded to
    u = 1: noise +inf, and a -inf score + inf = NaN, which argmax took: an excluded id drawn)."""
    from omniwalk.sampling import _gumbel_of_bits

    noise = _gumbel_of_bits(torch.tensor([0, 1, 2**23 - 2, 2**23 - 1]))
    assert torch.isfinite(noise).all() and (noise.diff() > 0).all()
