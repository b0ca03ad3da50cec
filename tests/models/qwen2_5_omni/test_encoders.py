"""Qwen2.5-Omni's audio and vision encoders vs HF's (fp32, two tiny configs, random weights and
inputs), packed several items per call; the window layout vs HF's ``get_vision_window_index``."""

from functools import cache

import numpy as np
import pytest
import torch
from helpers.qwen2_5_oracle import hf_checkpoint, hf_model

from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import load_components
from omniwalk.models.qwen2_5_omni.networks.audio_encoder import audio_output_lengths
from omniwalk.models.qwen2_5_omni.networks.vision_encoder import window_layout


@cache
def encoders(name: str) -> dict:
    cfg = Qwen25OmniConfig.from_hf(hf_checkpoint(name))
    return load_components(hf_checkpoint(name), ("audio_encoder", "vision_encoder"), cfg)


@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_audio_encoder_matches_hf(name):
    frames = [250, 73, 100, 1]  # whole chunks, ragged tails, one frame
    features = torch.randn(len(frames), 128, max(frames), generator=torch.Generator().manual_seed(1))
    ours = encoders(name)["audio_encoder"](features, frames)
    mask = (torch.arange(max(frames))[None] < torch.tensor(frames)[:, None]).long()
    ref = hf_model(name).thinker.get_audio_features(features, feature_attention_mask=mask).last_hidden_state
    assert ours.shape[0] == sum(int(audio_output_lengths(n)) for n in frames)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_vision_encoder_matches_hf(name):
    grids = [(1, 8, 12), (2, 6, 4), (1, 10, 14), (3, 2, 2)]  # windows ragged at both edges, videos
    pixels = torch.randn(
        sum(t * h * w for t, h, w in grids), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(2)
    )
    out = encoders(name)["vision_encoder"](pixels, grids)
    ref = hf_model(name).thinker.get_image_features(pixels, torch.tensor(grids)).pooler_output
    assert [m.shape[0] for m, _ in out.split()] == [r.shape[0] for r in ref]
    torch.testing.assert_close(out.embeddings, torch.cat(ref), rtol=0, atol=2e-5)


@pytest.mark.parametrize("window", [56, 84, 112])
def test_window_layout_is_hf_window_index(window):
    from transformers.vision_utils import get_vision_window_index

    grids = [(1, 8, 12), (2, 6, 4), (1, 10, 14)]
    index, cu = get_vision_window_index(torch.tensor(grids), 2, window, 14)
    ours = window_layout(grids, 2, window // 2 // 14)
    assert torch.equal(ours.tokens, index)
    assert ours.windows == np.diff(cu.numpy()).tolist()
