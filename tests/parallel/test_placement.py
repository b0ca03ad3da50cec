"""Stage placement (``ModelConfig.placement``): parsing and its errors, each stage built and run on its
device, and the same outputs as one device. On the CPU the two devices are "cpu" and "cpu:0": torch
keeps them apart as devices (a stage's modules and in-flight launcher carry the one it was given), so the talker
gets its own copy of the thinker's embedding table and the hand-offs take the cross-device path.
The same test on two GPUs is the ``gpu`` one below.

Stage placement on two GPUs: thinker on one, talker and vocoder on the other (CUDA graphs per
stage on its own device, hand-offs device to device) gives the outputs of one GPU."""

import pytest
import torch
from helpers.qwen3_omni import REQUESTS, checkpoint, greedy_speech, omni

from omniwalk import Omni
from omniwalk.config import ModelConfig
from omniwalk.errors import ConfigError
from omniwalk.parallel.placement import parse_placement, rank_options, replica_options

PLACED = "audio_encoder=cpu:0,vision_encoder=cpu,thinker=cpu:0,talker=cpu,vocoder=cpu:0"


def test_placement_parses_and_rejects_bad_strings():
    assert parse_placement("", "cpu") == {}
    assert parse_placement(" thinker = cuda:0 , talker=cuda:1,", "cuda") == {"thinker": "cuda:0", "talker": "cuda:1"}
    bad = {
        "thinker": "is not STAGE=DEVICE",
        "thinker=": "is not STAGE=DEVICE",
        "thinker=cpu,thinker=cpu": "placed twice",
        "thinker=gpu:0": r"'gpu:0' \(stage 'thinker'\) is not a torch device",
        "thinker=cuda:0": "is not a cpu device like --device 'cpu'",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            ModelConfig(model="m", placement=text)
    assert ModelConfig(model="m", placement="talker=cpu:0").device_of("talker") == "cpu:0"
    assert ModelConfig(model="m", placement="talker=cpu:0").device_of("thinker") == "cpu"


def test_unknown_stages_and_missing_gpus_are_named():
    with pytest.raises(ConfigError, match=r"unknown stage\(s\) \['thinkr'\]; this model's stages: \['audio_encoder'"):
        Omni(model=checkpoint("tiny"), placement="thinkr=cpu")
    if torch.cuda.device_count() < 8:
        missing = "cuda" if torch.cuda.device_count() == 0 else "cuda:7"  # (the first device missing is named)
        with pytest.raises(ConfigError, match=f"device {missing} does not exist: this machine has"):
            Omni(model=checkpoint("tiny"), device="cuda", placement="talker=cuda:7")


def test_replicas_and_ranks_get_devices_of_their_own():
    opts = {"device": "cuda", "placement": "thinker=cuda:0,talker=cuda:1,vocoder=cuda:1"}
    one = replica_options(opts, 1)
    assert one["device"] == "cuda:2" and one["placement"] == "thinker=cuda:2,talker=cuda:3,vocoder=cuda:3"
    tp = {"device": "cuda:0", "placement": "", "tensor_parallel": 2}
    assert rank_options(tp, 1)["device"] == "cuda:1" and replica_options(tp, 1)["device"] == "cuda:2"
    assert replica_options(rank_options(tp, 1), 1)["device"] == "cuda:3"
    assert replica_options({"device": "cpu", "placement": "talker=cpu:0"}, 3)["placement"] == "talker=cpu:0"


@torch.no_grad()
def test_placed_stages_run_on_their_devices_and_match_one_device():
    placed = omni("tiny", placement=PLACED)
    stages = placed.engine.stages
    for stage, where in parse_placement(PLACED, "cpu").items():
        assert stages[stage].inflight.device == torch.device(where), stage
        program = stages[stage].program
        assert str(program.device) == where, stage
    talker = stages["talker"].program
    assert talker.text_embedding is not placed.family.parts["thinker"].model.embed_tokens  # its own copy
    assert torch.equal(talker.text_embedding.weight, placed.family.parts["thinker"].model.embed_tokens.weight)
    request = greedy_speech(REQUESTS["image_audio_image"]["messages"])
    alone, apart = omni("tiny").generate(request), placed.generate(request)
    assert apart.token_ids == alone.token_ids and len(apart.token_ids) > 0
    assert torch.equal(apart.codes, alone.codes) and apart.codes.shape[0] > 0
    assert torch.equal(apart.audio, alone.audio)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
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
