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


def test_two_gpu_ranks_run_the_bf16_fast_path_with_graphs():
    out = _generate(greedy_speech(REQUESTS["audio"]["messages"]), dtype="bfloat16", tensor_parallel=2)
    assert len(out.token_ids) > 0 and out.codes.shape[0] > 0 and out.audio.numel() > 0
