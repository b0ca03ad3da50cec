"""Tensor parallelism on two GPUs (NCCL; collectives inside the captured decode and prefill graphs):
TP=2 gives TP=1's greedy ids on the tiny config in fp32, and runs the bf16 fast path (fused MoE on
each rank's slice of the experts, merged projections of its heads) to the end of a speech request."""

import pytest
import torch
from helpers.qwen3_omni import REQUESTS, checkpoint, greedy, greedy_speech

from omniwalk import Omni

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def _generate(requests, **options):
    omni = Omni(model=checkpoint("tiny"), device="cuda", **options)
    try:
        return omni.generate(requests)
    finally:
        omni.close()


def test_two_gpu_ranks_give_the_greedy_ids_of_one():
    requests = [greedy(32), {**REQUESTS["image_audio_image"], "max_tokens": 12, "min_tokens": 12, "temperature": 0.0}]
    one = _generate(requests, dtype="float32")
    two = _generate(requests, dtype="float32", tensor_parallel=2)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]


def _same_ids_or_a_near_tie(one, two) -> bool:
    """TP=2's greedy ids against TP=1's in bf16 (the all-reduce sums in another order than one GEMM, so the
    logits round differently): equal, or parting first where TP=1's top-2 logprobs are within 0.05 (a near
    tie), with the chosen tokens' logprobs within 0.05 of each other up to there. True where all are equal."""
    for k, (a, b) in enumerate(zip(one.token_ids, two.token_ids, strict=True)):
        if a != b:
            top = one.logprobs[k].top
            assert top[0][1] - top[1][1] < 0.05, f"ids part at {k} with a top-2 logprob gap of {top[0][1] - top[1][1]}"
            return False
        assert abs(one.logprobs[k].logprob - two.logprobs[k].logprob) < 0.05, (k, one.logprobs[k], two.logprobs[k])
    return True


def test_two_gpu_ranks_run_the_bf16_fast_path_with_graphs_and_match_one():
    """The bf16 fast path with graphs at TP=2 against TP=1, a text and a speech request: the same greedy ids
    (or a near tie, proven), and for speech, where the ids are equal, the same codes and audio (the talker
    and vocoder run on rank 0 alone, fed the thinker's rows)."""
    extra = {"logprobs": True, "top_logprobs": 2}
    requests = [greedy(32, **extra), greedy_speech(REQUESTS["audio"]["messages"], **extra)]
    one = _generate(requests, dtype="bfloat16")
    two = _generate(requests, dtype="bfloat16", tensor_parallel=2)
    for x, y in zip(one, two, strict=True):
        assert x.error is None and y.error is None and len(y.token_ids) == len(x.token_ids) > 0
    text, speech = zip(one, two, strict=True)
    _same_ids_or_a_near_tie(*text)
    if _same_ids_or_a_near_tie(*speech):
        x, y = speech
        assert y.codes.shape == x.codes.shape and x.codes.shape[0] > 0
        parted = (x.codes != y.codes).any(dim=1).nonzero()
        assert len(parted) == 0, f"ids equal, codes differ first at frame {int(parted[0])}"
        assert torch.equal(y.audio, x.audio)  # the same vocoder on rank 0, the same codes
