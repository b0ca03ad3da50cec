"""Qwen2.5-Omni token2wav (DiT flow matching + BigVGAN) against HF transformers 5.24, in fp32.

The oracle is ``Qwen2_5OmniToken2WavModel`` with a tiny config and random weights; HF draws the
ODE's initial noise from the global RNG, so reseeding it right before HF's call gives the noise
``initial_noise(seed, ...)`` draws from a seeded CPU generator.
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch
import torch.nn.functional as F

from omniwalk.errors import CheckpointError, ConfigError, InvalidRequestError
from omniwalk.models.qwen2_5_omni.networks.token2wav import (
    NoiseStream,
    Token2Wav,
    Token2WavConfig,
    initial_noise,
    load_state_dict_checked,
    ode_times,
)

# Two shapes: the real layout scaled down, and an uneven one (3 repeats, odd head count, two
# look-ahead layers, mel_dim 20 so noise pieces are not whole frames, one resblock kind).
CONFIGS = {
    "tiny": {
        "dit_config": {
            "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 8, "ff_mult": 2,
            "emb_dim": 16, "block_size": 4, "look_ahead_layers": [1], "look_backward_layers": [0, 2], "repeats": 2,
            "num_embeds": 30, "mel_dim": 16, "enc_emb_dim": 12, "enc_dim": 8, "enc_channels": [16, 16, 16, 32],
            "enc_kernel_sizes": [5, 3, 3, 1], "enc_dilations": [1, 2, 3, 1], "enc_attention_channels": 8,
            "enc_res2net_scale": 2, "enc_se_channels": 8, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "bigvgan_config": {
            "mel_dim": 16, "upsample_initial_channel": 32, "resblock_kernel_sizes": [3, 7],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]], "upsample_rates": [5, 3],
            "upsample_kernel_sizes": [11, 7],
        },
    },
    "uneven": {
        "dit_config": {
            "hidden_size": 36, "num_hidden_layers": 3, "num_attention_heads": 3, "head_dim": 6, "ff_mult": 3,
            "emb_dim": 10, "block_size": 6, "look_ahead_layers": [0, 2], "look_backward_layers": [1], "repeats": 3,
            "num_embeds": 40, "mel_dim": 20, "enc_emb_dim": 7, "enc_dim": 5, "enc_channels": [12, 12, 12, 12, 36],
            "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 6,
            "enc_res2net_scale": 3, "enc_se_channels": 5, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        },
        "bigvgan_config": {
            "mel_dim": 20, "upsample_initial_channel": 16, "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]], "upsample_rates": [4, 2], "upsample_kernel_sizes": [8, 4],
        },
    },
}  # fmt: skip
NAMES = list(CONFIGS)
REF_MEL_FRAMES = 30


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Matrices ~ N(0, 1/fan_in), vectors ~ N(0, 0.2^2), codec embeddings ~ N(0, 1) (so codes
    matter as much as the noise): HF's init leaves biases, Snake parameters and gates at
    constants that parity must not pass by."""
    for i, (name, p) in enumerate(model.named_parameters()):
        g = torch.Generator().manual_seed(seed * 1000 + i)
        scale = 1.0 if "codec_embed" in name else p[0].numel() ** -0.5 if p.dim() >= 2 else 0.2
        p.copy_(torch.randn(p.shape, generator=g) * scale)


@cache
def hf_token2wav(name: str):
    """A random HF token2wav whose waveform peaks near 0.5 (unclipped) on a calibration decode."""
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniToken2WavConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    torch.manual_seed(0)
    hf = Qwen2_5OmniToken2WavModel(Qwen2_5OmniToken2WavConfig(**copy.deepcopy(CONFIGS[name]))).eval()
    _randomize(hf, 1)
    peaks = []
    conv_post = hf.code2wav_bigvgan_model.conv_post
    hook = conv_post.register_forward_hook(lambda m, i, out: peaks.append(out.abs().max().item()))
    codes, cond, ref_mel = _codes(name, 20, 0), *_speaker(name, 0)
    with torch.no_grad():
        hf(codes[None], cond, ref_mel, num_steps=4)
        hook.remove()
        conv_post.weight.mul_(0.5 / peaks[0])
    return hf


@cache
def ours_for(name: str) -> Token2Wav:
    ours = Token2Wav(Token2WavConfig.from_hf(CONFIGS[name])).eval()
    load_state_dict_checked(ours, hf_token2wav(name).state_dict())
    return ours


def _codes(name: str, length: int, seed: int) -> torch.Tensor:
    high = CONFIGS[name]["dit_config"]["num_embeds"] + 1
    return torch.randint(0, high, (length,), generator=torch.Generator().manual_seed(seed))


def _speaker(name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A voice's spk_dict entry: cond [1, enc_emb_dim], ref_mel [1, T, mel] (log-mel-like values)."""
    dit = CONFIGS[name]["dit_config"]
    g = torch.Generator().manual_seed(100 + seed)
    cond = torch.randn(1, dit["enc_emb_dim"], generator=g)
    return cond, torch.randn(1, REF_MEL_FRAMES, dit["mel_dim"], generator=g) - 4.0


def hf_wave(name: str, codes, speaker: int, seed: int, num_steps: int) -> torch.Tensor:
    hf, (cond, ref_mel) = hf_token2wav(name), _speaker(name, speaker)
    torch.manual_seed(seed)  # HF draws its noise from the global RNG inside ``sample``
    with torch.no_grad():
        return hf(codes[None], cond, ref_mel, num_steps=num_steps).reshape(-1)


def our_wave(name: str, codes, speaker: int, seed: int, num_steps: int | None) -> torch.Tensor:
    ours = ours_for(name)
    dit = ours.cfg.dit
    noise = initial_noise(seed, codes.shape[0] * dit.repeats, dit.mel_dim)
    return ours(codes, ours.speaker_rows(*_speaker(name, speaker)), noise, num_steps)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.double(), b.double(), dim=0).item()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("speaker", [0, 1])
def test_waveform_matches_hf(name, speaker):
    """Same seeded noise, same ODE steps: cosine >= 0.9999 (measured: bitwise equal, max |diff| 0)."""
    codes = _codes(name, 29, seed=speaker + 3)
    for seed, steps in ((7, 10), (8, 4)):
        ref = hf_wave(name, codes, speaker, seed, steps)
        out = our_wave(name, codes, speaker, seed, steps)
        assert out.shape == ref.shape == (29 * CONFIGS[name]["dit_config"]["repeats"] * _samples_per_frame(name),)
        assert (ref.abs() >= 1).float().mean() < 0.01, "the oracle clips: the comparison would hide differences"
        assert ref.std() > 0.02
        assert _cosine(out, ref) >= 0.9999
        assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_mel_matches_hf(name):
    """The DiT's ODE solution alone (the vocoder smooths differences): measured bitwise equal."""
    hf, ours = hf_token2wav(name), ours_for(name)
    codes, (cond, ref_mel) = _codes(name, 23, seed=9), _speaker(name, 1)
    torch.manual_seed(5)
    with torch.no_grad():
        ref = hf.code2wav_dit_model.sample(cond, ref_mel, codes[None], num_steps=6)[0]
    noise = initial_noise(5, 23 * ours.cfg.dit.repeats, ours.cfg.dit.mel_dim)
    with torch.inference_mode():
        rows = ours.dit.condition_rows(ours.speaker_rows(cond, ref_mel), codes)
        mel = ours.solve(noise, rows, ode_times(6, ours.cfg.flow.sway_coefficient), ours.cfg.flow)[0].T
    assert _cosine(mel.reshape(-1), ref.reshape(-1)) >= 0.99999
    assert (mel - ref).abs().max() < 1e-5


def test_speakers_seeds_and_codes_change_the_waveform():
    """Guards against a comparison that passes by ignoring its inputs: each input moves the
    waveform far more than the parity bar (measured cosines 0.87-0.99 in both configs)."""
    for name in NAMES:
        codes = _codes(name, 29, seed=3)
        base = our_wave(name, codes, 0, 7, 4)
        assert _cosine(base, our_wave(name, codes, 1, 7, 4)) < 0.999
        assert _cosine(base, our_wave(name, codes, 0, 8, 4)) < 0.999
        assert _cosine(base, our_wave(name, _codes(name, 29, seed=4), 0, 7, 4)) < 0.999


def test_default_steps_are_hf_defaults():
    codes = _codes("tiny", 12, seed=5)
    assert torch.equal(our_wave("tiny", codes, 0, 3, None), hf_wave("tiny", codes, 0, 3, 10))


def _samples_per_frame(name: str) -> int:
    return ours_for(name).cfg.bigvgan.samples_per_frame


def test_missing_and_unexpected_tensors_are_named():
    state = dict(hf_token2wav("tiny").state_dict())
    del state["code2wav_dit_model.transformer_blocks.1.attn.to_k.weight"]
    state["code2wav_bigvgan_model.extra.weight"] = torch.zeros(1)
    ours = Token2Wav(Token2WavConfig.from_hf(CONFIGS["tiny"]))
    with pytest.raises(CheckpointError, match=r"missing code2wav_dit_model\.transformer_blocks\.1\.attn\.to_k\.weight"):
        load_state_dict_checked(ours, state)
    with pytest.raises(CheckpointError, match=r"unexpected code2wav_bigvgan_model\.extra\.weight"):
        load_state_dict_checked(ours, state)


def test_config_errors_name_the_field():
    bad = copy.deepcopy(CONFIGS["tiny"])
    bad["dit_config"]["enc_channels"] = [16, 16, 16, 30]
    with pytest.raises(ConfigError, match=r"token2wav_config\.dit_config\.enc_channels"):
        Token2WavConfig.from_hf(bad)
    bad = copy.deepcopy(CONFIGS["tiny"])
    bad["bigvgan_config"]["mel_dim"] = 8
    with pytest.raises(ConfigError, match="mel_dim"):
        Token2WavConfig.from_hf(bad)


def test_bad_requests_are_typed_errors():
    ours = ours_for("tiny")
    speaker = ours.speaker_rows(*_speaker("tiny", 0))
    with pytest.raises(InvalidRequestError, match="codec ids"):
        ours(torch.tensor([3, 31]), speaker, initial_noise(0, 4, 16))
    with pytest.raises(InvalidRequestError, match="num_steps"):
        ours(torch.tensor([3, 4]), speaker, initial_noise(0, 4, 16), num_steps=1)


@pytest.mark.parametrize("mel_dim", [80, 16, 20])
def test_noise_stream_is_the_one_shot_noise(mel_dim):
    """Pieces of whole 16-value groups concatenate to one draw (the CPU generator's Box-Muller groups)."""
    stream = NoiseStream(11, mel_dim)
    pieces = [stream.get(0, 37), stream.get(37, 40), stream.get(40, 400), stream.get(100, 2000)]
    assert torch.equal(torch.cat(pieces[:3] + [pieces[3][300:]]), initial_noise(11, 2000, mel_dim)[0])
