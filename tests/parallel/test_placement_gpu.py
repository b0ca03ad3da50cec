"""Stage placement on two GPUs: thinker on one, talker and vocoder on the other (CUDA graphs per
stage on its own device, hand-offs device to device) gives the outputs of one GPU."""

import pytest
import torch
from helpers.qwen3_omni import REQUESTS, checkpoint, greedy_speech

from omniwalk import Omni

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def test_thinker_and_talker_on_two_gpus_match_one_gpu():
    options = {"device": "cuda", "dtype": "bfloat16"}
    request = greedy_speech(REQUESTS["image_audio_image"]["messages"])
    alone = Omni(model=checkpoint("tiny"), **options).generate(request)
    placed = Omni(model=checkpoint("tiny"), placement="thinker=cuda:0,talker=cuda:1,vocoder=cuda:1", **options)
    stages = placed.engine.stages
    assert stages["talker"].program.text_embedding.weight.device == torch.device("cuda:1")
    assert stages["talker"].program.frame_graph is not None  # captured on cuda:1
    apart = placed.generate(request)
    assert apart.token_ids == alone.token_ids
    assert torch.equal(apart.codes, alone.codes) and apart.codes.shape[0] > 0
    assert apart.text == alone.text and apart.finish_reason == alone.finish_reason
    assert torch.equal(apart.audio, alone.audio)  # the same vocoder kernels on the same codes, on the other card
