"""Native audio encoder vs HF's Qwen3-Omni audio tower (tiny random checkpoints, fp32 CPU).

On the GPU machine: the full-size audio encoder's bf16 parity with HF bf16."""

import numpy as np
import pytest
import torch
from helpers.hf_oracle import assert_parity, config_dict, hf_checkpoint, hf_model

from omniwalk.media.mel import log_mel
from omniwalk.models.common.checkpoint.weights import load_weights
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder, audio_output_lengths


@pytest.fixture(scope="module", params=["tiny", "uneven"])
def encoders(request):
    name = request.param
    ours = AudioEncoder(Qwen3OmniConfig.from_hf(config_dict(name)).audio).eval()
    load_weights(ours, hf_checkpoint(name), prefix="thinker.audio_tower.")
    return ours, hf_model(name).thinker.model.audio_tower


def _hf_one(tower, features: torch.Tensor, n: int) -> torch.Tensor:
    return tower(features[:, :n], feature_lens=torch.tensor([n])).last_hidden_state


@pytest.mark.parametrize(
    "frames,tokens",
    [(1, 1), (50, 7), (99, 13), (100, 13), (101, 14), (150, 20), (200, 26), (1000, 130), (3000, 390), (30000, 3900)],
)
def test_output_lengths(frames, tokens):
    assert audio_output_lengths(frames) == tokens
    assert audio_output_lengths(torch.tensor([frames])).item() == tokens


# window boundaries: tiny windows are 26 tokens (n_window_infer 200), uneven 52 (400)
@pytest.mark.parametrize("num_frames", [37, 100, 213, 1234])
@torch.no_grad()
def test_single_clip_matches_hf(encoders, num_frames):
    ours, tower = encoders
    features = torch.randn(128, num_frames, generator=torch.Generator().manual_seed(num_frames))
    out = ours(features[None], [num_frames])
    assert out.shape[0] == audio_output_lengths(num_frames)
    assert_parity(out, _hf_one(tower, features, num_frames))


@torch.no_grad()
def test_packed_clips_match_hf_and_one_at_a_time(encoders):
    ours, tower = encoders
    lengths = [1234, 57, 401, 100, 9, 2000]
    features = torch.randn(len(lengths), 128, max(lengths), generator=torch.Generator().manual_seed(1))
    packed = ours(features, lengths)
    assert packed.shape[0] == sum(ours.output_lengths(lengths))
    per_clip = packed.split(ours.output_lengths(lengths))
    for b, n in enumerate(lengths):
        assert_parity(per_clip[b], _hf_one(tower, features[b], n))
        assert_parity(per_clip[b], ours(features[b : b + 1, :, :n], [n]))


@torch.no_grad()
def test_log_mel_to_encoder_end_to_end(encoders):
    from helpers.hf_oracle import whisper_extractor

    ours, tower = encoders
    extractor = whisper_extractor()
    waves = [np.random.default_rng(i).standard_normal(n).astype(np.float32) * 0.1 for i, n in enumerate([35000, 8000])]
    features, frames = log_mel([torch.from_numpy(w) for w in waves])
    out = ours(features, frames.tolist()).split(ours.output_lengths(frames.tolist()))
    for wave, mine in zip(waves, out, strict=True):
        ref = extractor(
            [wave], sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt"
        )
        assert_parity(mine, _hf_one(tower, ref["input_features"][0], ref["attention_mask"].sum().item()))


def test_parameter_names_mirror_checkpoint(encoders):
    names = set(dict(encoders[0].named_parameters()))
    assert {
        "conv2d1.weight",
        "conv_out.weight",
        "layers.0.self_attn.q_proj.bias",
        "ln_post.weight",
        "proj2.bias",
    } <= names
    assert not list(encoders[0].state_dict().keys() - names)  # no persistent buffers


@pytest.mark.gpu
@torch.inference_mode()
def test_audio_encoder_full_size_bf16_matches_hf():
    from helpers.gpu_pairs import audio_pair, cosine, report

    from omniwalk.media.mel import log_mel

    ours, hf = audio_pair()
    g = torch.Generator(device="cuda").manual_seed(1)
    waves = [torch.randn(n, generator=g, device="cuda") * 0.1 for n in (16000 * 5, 16000 * 13 + 123, 8000)]
    features, frames = log_mel(waves)
    out = ours(features, frames.tolist())
    packed = torch.cat([features[i, :, : int(n)] for i, n in enumerate(frames)], dim=1)
    ref = hf(packed.to(torch.bfloat16), feature_lens=frames).last_hidden_state
    assert out.shape == ref.shape
    assert report("audio encoder", cosine(out, ref)) >= 0.999
