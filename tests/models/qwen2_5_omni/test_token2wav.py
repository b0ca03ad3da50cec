"""Qwen2.5-Omni token2wav (DiT flow matching + BigVGAN) against HF transformers 5.24, in fp32.

The oracle is ``Qwen2_5OmniToken2WavModel`` with a tiny config and random weights; HF draws the
ODE's initial noise from the global RNG, so reseeding it right before HF's call gives the noise
``initial_noise(seed, ...)`` draws from a seeded CPU generator.

Qwen2.5-Omni token2wav's CUDA graphs (the batched RK step per padded length, BigVGAN per span
length) against the same program eager, on the GPU with the full-size 7B token2wav config (fp32,
random audible weights): a mixed batch of streamed requests (windows joining and leaving between
steps) and one-shot decodes (eager by design: rows longer than any graph)."""

from __future__ import annotations

import copy
from functools import cache
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.replay import ReplayOnCPU

from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.request import EngineRequest, Status
from omniwalk.errors import CheckpointError, ConfigError, InvalidRequestError
from omniwalk.layers.decoder import use_kernels
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import audible_token2wav, load_config_dict
from omniwalk.models.qwen2_5_omni.networks.dit import block_masks
from omniwalk.models.qwen2_5_omni.networks.token2wav import (
    NoiseStream,
    Token2Wav,
    Token2WavConfig,
    initial_noise,
    load_state_dict_checked,
    ode_times,
)
from omniwalk.models.qwen2_5_omni.networks.token2wav_stream import StreamPlan, StreamState, Window
from omniwalk.models.qwen2_5_omni.programs.token2wav_program import Token2WavProgram, Token2WavState

# Two shapes: the real layout scaled down, and an uneven one (3 repeats, odd head count, two
# look-ahead layers, mel_dim 20 so noise pieces are not whole frames, one resblock kind).
CONFIGS = {
    "tiny": {
        "dit_config": {
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "head_dim": 8,
            "ff_mult": 2,
            "emb_dim": 16,
            "block_size": 4,
            "look_ahead_layers": [1],
            "look_backward_layers": [0, 2],
            "repeats": 2,
            "num_embeds": 30,
            "mel_dim": 16,
            "enc_emb_dim": 12,
            "enc_dim": 8,
            "enc_channels": [16, 16, 16, 32],
            "enc_kernel_sizes": [5, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 1],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 2,
            "enc_se_channels": 8,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "bigvgan_config": {
            "mel_dim": 16,
            "upsample_initial_channel": 32,
            "resblock_kernel_sizes": [3, 7],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
            "upsample_rates": [5, 3],
            "upsample_kernel_sizes": [11, 7],
        },
    },
    "uneven": {
        "dit_config": {
            "hidden_size": 36,
            "num_hidden_layers": 3,
            "num_attention_heads": 3,
            "head_dim": 6,
            "ff_mult": 3,
            "emb_dim": 10,
            "block_size": 6,
            "look_ahead_layers": [0, 2],
            "look_backward_layers": [1],
            "repeats": 3,
            "num_embeds": 40,
            "mel_dim": 20,
            "enc_emb_dim": 7,
            "enc_dim": 5,
            "enc_channels": [12, 12, 12, 12, 36],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 6,
            "enc_res2net_scale": 3,
            "enc_se_channels": 5,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        },
        "bigvgan_config": {
            "mel_dim": 20,
            "upsample_initial_channel": 16,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
            "upsample_rates": [4, 2],
            "upsample_kernel_sizes": [8, 4],
        },
    },
}
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
    for seed, steps in ((7, 6), (8, 3)):  # (the default 10: test_default_steps_are_hf_defaults)
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


@pytest.mark.parametrize("name", NAMES)
def test_bf16_dit_stays_close_to_fp32(name):
    """A bf16 model runs the DiT's per-step layers in bf16 (``DiT.run_in``, the loader) and keeps the
    ODE state, embeddings, speaker encoder and BigVGAN in fp32: same shapes and dtypes out, waveform
    cosine >= 0.999 against the fp32 decode, while it does differ (the bf16 layers are in use)."""
    ours, low = ours_for(name), copy.deepcopy(ours_for(name))
    low.dit.run_in(torch.bfloat16)
    assert low.dit.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    kept = (low.dit.time_embed, low.dit.text_embed, low.dit.input_embed.spk_encoder, low.bigvgan)
    assert all(p.dtype == torch.float32 for m in kept for p in m.parameters())
    codes, speaker = _codes(name, 29, seed=3), ours.speaker_rows(*_speaker(name, 0))
    noise = initial_noise(7, 29 * ours.cfg.dit.repeats, ours.cfg.dit.mel_dim)
    ref, out = ours(codes, speaker, noise, 6), low(codes, speaker, noise, 6)
    assert out.dtype == ref.dtype == torch.float32 and out.shape == ref.shape
    assert not torch.equal(out, ref)
    assert _cosine(out, ref) >= 0.999


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


# --- streaming ------------------------------------------------------------------------------------


def _velocity(ours: Token2Wav, x, codes, speaker_rows, t: float) -> torch.Tensor:
    """One guided DiT evaluation over a single unpadded row."""
    n = x.shape[1]
    masks = block_masks(ours.cfg.dit, [n, n], n, x.device)
    rows = ours.dit.condition_rows(speaker_rows, codes)
    return ours.dit.velocity(x, torch.tensor([t]), rows, masks, ours.cfg.flow.guidance_scale)


@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_windows_cover_one_forward_exactly(name):
    """The chunking is derived from the block mask: one DiT evaluation over a window gives its kept
    frames as over the whole utterance (P blocks back and F ahead are enough), and one block less
    of look-back is not."""
    ours = ours_for(name)
    plan = StreamPlan.build(ours.cfg)
    r, codes = ours.cfg.dit.repeats, _codes(name, 40, seed=2)
    x = initial_noise(4, 40 * r, ours.cfg.dit.mel_dim)
    speaker = ours.speaker_rows(*_speaker(name, 0))
    full = _velocity(ours, x, codes, speaker, 0.3)[0]
    for k in (1, 2):
        w = plan.window(k, 40 * r, finished=False)
        part = _velocity(ours, x[:, w.start : w.end], codes[w.start // r : w.end // r], speaker, 0.3)[0]
        kept = slice(w.keep_start - w.start, w.keep_end - w.start)
        assert (part[kept] - full[w.keep_start : w.keep_end]).abs().max() < 1e-5
        short = w.start + ours.cfg.dit.block_size  # one block less of look-back
        part = _velocity(ours, x[:, short : w.end], codes[short // r : w.end // r], speaker, 0.3)[0]
        assert (part[w.keep_start - short : w.keep_end - short] - full[w.keep_start : w.keep_end]).abs().max() > 1e-3


@pytest.mark.parametrize("pattern", ["uneven", "chunks", "jump"])
@pytest.mark.parametrize("name", NAMES)
@torch.inference_mode()
def test_vocoder_spans_equal_one_shot(name, pattern):
    """BigVGAN over the spans a stream decodes (context = its receptive field) equals one decode. Mel
    becomes final in uneven pieces, or a chunk at a time as windows solve (then every span with its full
    left context has the regular length, the last one extended back to it: more left context), or
    jumping ahead (windows solved together: the stream catches up a regular span a step)."""
    ours = ours_for(name)
    plan = StreamPlan.build(ours.cfg)
    c = plan.chunk
    ends = {
        "uneven": (10, 30, 31, 70, 83),
        "chunks": (*range(c, 9 * c, c), 8 * c + 4),
        "jump": (c, 2 * c, 7 * c, 7 * c + 6),
    }
    ends = ends[pattern]
    mel_dim, frames = ours.cfg.dit.mel_dim, ends[-1]
    mel = torch.randn(frames, mel_dim, generator=torch.Generator().manual_seed(3)) - 3
    stream = StreamState(plan, 0, mel_dim)
    stream.finish(frames // plan.repeats + 1)
    stream.num_total = frames
    out, done, spans = [], 0, []
    for end in ends:  # mel becoming final in uneven pieces
        window = Window(done, done, end, end)
        kept = stream.kept_mel([(window, mel[done:end])])
        while (span := stream.next_span(end)) is not None:  # (several when final mel jumps ahead: a step each)
            spans.append(span)
            wav = ours.bigvgan(stream.span_mel(kept, span)[None])[0]
            first = (span.emit_start - span.start) * ours.cfg.bigvgan.samples_per_frame
            out.append(wav[first : first + (span.emit_end - span.emit_start) * ours.cfg.bigvgan.samples_per_frame])
            stream.add(kept, end, span)
            kept = stream.mel
        stream.add(kept, end, None)
        done = end
    assert stream.is_done and len(out) >= 3
    last = spans[-1]
    if pattern != "uneven":
        lengths = {s.end - s.start for s in spans if s.emit_start >= plan.vocoder_context}  # (full left context)
        assert lengths == {plan.tail_span} == {c + 2 * plan.vocoder_context}
    assert last.emit_start - last.start >= plan.vocoder_context
    one_shot = ours.bigvgan(mel.T[None])[0]
    assert torch.cat(out).shape == one_shot.shape
    assert (torch.cat(out) - one_shot).abs().max() < 1e-5


def _request(rid: str, voice: str, seed: int, num_steps: int | None = None) -> EngineRequest:
    state = SimpleNamespace(token2wav=Token2WavState(voice=voice, seed=seed, num_steps=num_steps))
    return EngineRequest(id=rid, walk=("token2wav",), state=state)


def _voices(name: str) -> dict:
    return {f"Voice{i}": dict(zip(("cond", "ref_mel"), _speaker(name, i), strict=True)) for i in (0, 1)}


def run_stream(name: str, jobs: list[tuple[EngineRequest, torch.Tensor, int, int]], stream=None, budget=4096) -> None:
    """Run token2wav requests through a batch stage; job = (request, codes, first step, codes per
    step): its codes arrive from that step on, that many per step (the talker), then it ends."""
    program = Token2WavProgram(ours_for(name), _voices(name), "cpu", stream)
    stage = BatchStage("token2wav", program, BatchStageConfig(max_batch_units=budget))
    for req, *_ in jobs:
        stage.add(req)
    for step in range(10_000):
        for req, codes, first, per_step in jobs:
            st = req.state.token2wav
            if step >= first and not st.finished:
                st.codes.extend(codes[len(st.codes) : len(st.codes) + per_step].tolist())
                st.finished = len(st.codes) == len(codes)
        stage.step()
        stage.finish()
        if all(stage.is_done(req) for req, *_ in jobs):
            return
    raise AssertionError("token2wav did not finish")


def _audio(req: EngineRequest) -> torch.Tensor:
    chunks = [e.data for e in req.events if e.kind == "audio"]
    assert all(torch.equal(a, b) for a, b in zip(chunks, req.state.token2wav.chunks, strict=True))
    return torch.cat(chunks)


@pytest.mark.parametrize("name", NAMES)
def test_short_utterance_streams_exactly(name):
    """An utterance inside one window (fewer than C + F frames) is one solve: streamed == one-shot.
    (Its length makes frames * mel_dim a multiple of 16, so ``NoiseStream`` is the one-shot noise.)"""
    plan, mel_dim = StreamPlan.build(ours_for(name).cfg), CONFIGS[name]["dit_config"]["mel_dim"]
    num_codes = max(
        n for n in range(1, (plan.chunk + plan.ahead) // plan.repeats) if n * plan.repeats * mel_dim % 16 == 0
    )
    codes = _codes(name, num_codes, seed=6)
    req = _request("a", "voice1", seed=21, num_steps=5)
    run_stream(name, [(req, codes, 0, 2)])
    assert len(req.state.token2wav.chunks) == 1
    assert (_audio(req) - our_wave(name, codes, 1, 21, 5)).abs().max() < 1e-5


@torch.inference_mode()
def windowed_mel(name: str, codes, speaker: int, seed: int, num_steps: int, plan: StreamPlan) -> torch.Tensor:
    """The streamed mel by its definition: each window solved alone, its kept frames concatenated."""
    ours = ours_for(name)
    r, total = plan.repeats, codes.shape[0] * plan.repeats
    noise, rows = initial_noise(seed, total, ours.cfg.dit.mel_dim), ours.speaker_rows(*_speaker(name, speaker))
    times, parts, k = ode_times(num_steps, ours.cfg.flow.sway_coefficient), [], 0
    while sum(p.shape[0] for p in parts) < total:
        w = plan.window(k, total, finished=True)
        conditions = ours.dit.condition_rows(rows, codes[w.start // r : w.end // r])
        mel = ours.solve(noise[:, w.start : w.end], conditions, times, ours.cfg.flow)[0]
        parts.append(mel[w.keep_start - w.start : w.keep_end - w.start])
        k += 1
    return torch.cat(parts)


@pytest.mark.parametrize("name", NAMES)
def test_streamed_audio_is_the_windowed_mel_and_near_one_shot(name):
    """Streamed audio = BigVGAN of the windowed mel (the vocoder streams exactly), and the windowed
    mel is within 0.5% (relative L2) of the one-shot mel: measured 0.07-0.22% over chunks of 1-6
    blocks and 4-10 steps in both configs (random weights; a trained DiT may couple blocks more).
    End to end, waveform cosine >= 0.9999 (measured >= 0.999999, max |diff| <= 9e-4 at RMS 0.16)."""
    ours, num_codes = ours_for(name), 44 if name == "tiny" else 40
    plan, codes = StreamPlan.build(ours.cfg), _codes(name, num_codes, seed=12)
    req = _request("a", "voice0", seed=31, num_steps=4)
    run_stream(name, [(req, codes, 0, 3)])
    audio, chunks = _audio(req), req.state.token2wav.chunks
    mel = windowed_mel(name, codes, 0, 31, 4, plan)
    with torch.inference_mode():
        assert (audio - ours.bigvgan(mel.T[None])[0]).abs().max() < 1e-5
        one_shot_mel = ours.solve(
            initial_noise(31, num_codes * plan.repeats, ours.cfg.dit.mel_dim),
            ours.dit.condition_rows(ours.speaker_rows(*_speaker(name, 0)), codes),
            ode_times(4, ours.cfg.flow.sway_coefficient),
            ours.cfg.flow,
        )[0]
    assert (mel - one_shot_mel).norm() / one_shot_mel.norm() < 5e-3
    assert len(chunks) >= 3
    assert _cosine(audio, our_wave(name, codes, 0, 31, 4)) >= 0.9999


# --- the batch stage -------------------------------------------------------------------------------

# (voice, seed, ODE steps, codes, codes' seed, first step, codes per step)
MIXED = [
    ("voice0", 1, 4, 30, 40, 0, 2),
    ("VOICE1", 2, 3, 17, 41, 3, 5),  # voices match case-insensitively
    ("voice0", 3, 5, 5, 42, 1, 9),  # one short window
    ("voice1", 4, None, 8, 43, 2, 8),  # the default steps (10)
]


def _mixed_jobs(name: str, prefix: str, specs=MIXED):
    return [
        (_request(f"{prefix}{i}", voice, seed, steps), _codes(name, n, code_seed), first, per_step)
        for i, (voice, seed, steps, n, code_seed, first, per_step) in enumerate(specs)
    ]


@pytest.mark.parametrize("budget", [4096, 40])
def test_batch_equals_each_alone(budget):
    """Requests with different voices, seeds, steps, lengths and arrivals, solved in shared batched
    RK steps (the small budget also splits and delays them), give each the audio it gets alone, to
    float rounding: padded rows and other batch shapes round differently (measured max |diff|
    4.5e-7 to 7.2e-7 at RMS 0.16)."""
    together = _mixed_jobs("tiny", "t")
    run_stream("tiny", together, budget=budget)
    for job in together:
        alone = _mixed_jobs("tiny", "a")[together.index(job)]
        run_stream("tiny", [alone])
        assert (_audio(job[0]) - _audio(alone[0])).abs().max() < 2e-6
        assert _audio(job[0]).shape[0] == len(job[1]) * 2 * _samples_per_frame("tiny")


def test_bad_voice_fails_only_its_request():
    good, bad = _mixed_jobs("tiny", "g", MIXED[:1])[0], _mixed_jobs("tiny", "b", MIXED[1:2])[0]
    bad[0].state.token2wav.voice = "nobody"
    run_stream("tiny", [good, bad])
    assert isinstance(bad[0].error, InvalidRequestError) and "nobody" in str(bad[0].error)
    alone = _mixed_jobs("tiny", "a", MIXED[:1])[0]
    run_stream("tiny", [alone])
    assert torch.equal(_audio(good[0]), _audio(alone[0]))


def test_release_frees_a_request_mid_stream():
    program = Token2WavProgram(ours_for("tiny"), _voices("tiny"), "cpu")
    stage = BatchStage("token2wav", program, BatchStageConfig())
    (req, codes, *_), (other, other_codes, *_) = _mixed_jobs("tiny", "r", MIXED[:2])
    for r, c in ((req, codes), (other, other_codes)):
        r.state.token2wav.codes = c.tolist()
        r.state.token2wav.finished = True
        stage.add(r)
    stage.step()
    assert program.rows[req.id] and program.rows[other.id]
    assert program.stats() == {"rows": len(program.rows[req.id]) + len(program.rows[other.id]), "rk_steps": 1}
    req.status = Status.ABORTED  # what the engine's abort does
    stage.remove(req)
    assert req.id not in program.rows and req.id not in program.starting
    while not stage.is_done(other):
        stage.step()
        stage.finish()
    assert req.id not in program.rows and not req.events
    assert _audio(other).shape[0] == len(other_codes) * 2 * _samples_per_frame("tiny")


def test_loads_what_save_pretrained_writes(tmp_path):
    """HF's safetensors (the full model nests these names under ``token2wav.``) load completely."""
    from omniwalk.models.common.checkpoint.weights import load_weights

    hf_token2wav("uneven").save_pretrained(tmp_path)
    ours = Token2Wav(Token2WavConfig.from_hf(CONFIGS["uneven"])).eval()
    load_weights(ours, tmp_path)
    codes = _codes("uneven", 8, seed=1)
    noise = initial_noise(2, 24, 20)
    speaker = ours.speaker_rows(*_speaker("uneven", 0))
    assert torch.equal(ours(codes, speaker, noise, 3), ours_for("uneven")(codes, speaker, noise, 3))


def test_graph_path_pads_rows_and_lengths_exactly(monkeypatch):
    """The program's graph path (rows padded to a captured window length and batch bucket, BigVGAN at
    captured span lengths) replayed on the CPU: the audio equals the eager path's to rounding, and
    both kinds of graph ran (the GPU test compares real CUDA graphs with eager)."""
    import omniwalk.models.qwen2_5_omni.programs.token2wav_program as module

    eager = _mixed_jobs("tiny", "e")
    run_stream("tiny", eager)
    monkeypatch.setattr(module, "GraphedStep", ReplayOnCPU)
    graphed, programs = _mixed_jobs("tiny", "g"), []
    original = Token2WavProgram.__init__

    def with_graphs(self, *args, **kwargs):
        original(self, *args, **kwargs, graph_max_batch=3)
        self.capture_graphs()
        programs.append(self)

    monkeypatch.setattr(Token2WavProgram, "__init__", with_graphs)
    run_stream("tiny", graphed)
    program = programs[0]
    assert sum(g.num_replays for g in program.dit_graphs.values()) > 0
    assert sum(g.num_replays for g in program.vocoder_graphs.values()) > 0
    assert program.stats()["eager_calls"] > 0  # (spans of other lengths: the ends of utterances)
    for (req, *_), (ref, *_) in zip(graphed, eager, strict=True):
        assert (_audio(req) - _audio(ref)).abs().max() < 2e-6


# (codes, codes the talker adds per step, one-shot): 1 to 5 windows of 144 mel frames, two one-shot
JOBS = [(40, 4), (120, 6), (90, 3), (200, 8), (64, 5), (150, 7), (33, 2)]
ONE_SHOT = {1, 5}


@pytest.fixture(scope="module")
def model_and_voices():
    cfg = Qwen25OmniConfig.from_hf(load_config_dict("qwen2.5-omni-7b")).token2wav
    g = torch.Generator().manual_seed(3)
    voices = {
        name: {
            "cond": torch.randn(1, cfg.dit.enc_emb_dim, generator=g),
            "ref_mel": torch.randn(1, 30, cfg.dit.mel_dim, generator=g) - 4.0,
        }
        for name in ("chelsie", "ethan")
    }
    model = Token2Wav(cfg).cuda().eval()
    audible_token2wav(model, voices["chelsie"], 0)
    use_kernels(model, "fused")  # (the served fast path: the graphs record its kernels)
    return model, voices


def run(model, voices, graph_max_batch: int) -> tuple[dict[str, torch.Tensor], dict]:
    program = Token2WavProgram(model, voices, "cuda", state_of=lambda req: req.state, graph_max_batch=graph_max_batch)
    program.capture_graphs()
    stage = BatchStage("token2wav", program, BatchStageConfig(max_batch_units=16384), "cuda")
    g = torch.Generator().manual_seed(1)
    jobs = []
    for i, (n, per_step) in enumerate(JOBS):
        codes = torch.randint(0, model.cfg.dit.num_embeds, (n,), generator=g).tolist()
        st = Token2WavState(("chelsie", "ethan")[i % 2], seed=i, num_steps=(4, 10)[i % 2], one_shot=i in ONE_SHOT)
        req = EngineRequest(f"r{i}", ("token2wav",), st)
        stage.add(req)
        jobs.append((req, codes, per_step))
    for _ in range(10_000):
        for req, codes, per_step in jobs:
            st = req.state
            st.codes.extend(codes[len(st.codes) : len(st.codes) + per_step])
            st.finished = len(st.codes) == len(codes)
        stage.step()
        stage.finish()
        if all(stage.is_done(req) for req, _, _ in jobs):
            break
    assert all(req.error is None for req, _, _ in jobs)
    return {req.id: torch.cat(req.state.chunks) for req, _, _ in jobs}, program.stats()


@pytest.mark.gpu
@torch.inference_mode()
def test_graphs_equal_eager(model_and_voices):
    eager, _ = run(*model_and_voices, graph_max_batch=0)
    graphed, stats = run(*model_and_voices, graph_max_batch=16)
    assert stats["graph_replays"] > 0 and stats["eager_calls"] > 0  # (one-shot rows and end spans: eager)
    for rid, ref in eager.items():
        out = graphed[rid]
        assert out.shape == ref.shape and ref.std() > 0.01
        # padded rows and batch shapes round differently (fp32; cuDNN convolutions may use TF32)
        assert F.cosine_similarity(out.double(), ref.double(), dim=0) >= 0.99999, rid
        assert (out - ref).abs().max() < 2e-3, rid
