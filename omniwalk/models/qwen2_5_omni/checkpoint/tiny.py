"""``omniwalk make-tiny`` for Qwen2.5-Omni: a Hugging Face-style checkpoint with random weights.

Writes config.json, safetensors weights of our components in the checkpoint's naming (the
thinker with its encoders, the talker, token2wav), ``spk_dict.pt`` (speaker name -> ``bos_token`` (a thinker
id), ``cond`` [1, enc_emb_dim], ``ref_mel`` [1, T, mel_dim], as the published file holds them),
tokenizer.json (byte-level BPE, this model's special-token spellings at their configured ids),
tokenizer_config.json with the chat template, preprocessor_config.json, generation_config.json.

The shared random init (unit-scale "embed" matrices) saturates token2wav: the DiT's mel runs to
~1e3, BigVGAN's dB clamp flattens it, and the waveform ignores codes and noise. So
``write_token2wav`` draws token2wav's tensors at scales that keep every input audible and scales
``conv_post`` so the waveform stays inside BigVGAN's [-1, 1] clamp.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from omniwalk.models.common.checkpoint import tiny
from omniwalk.models.common.checkpoint.tiny import DEFAULT_MAX_SHARD_BYTES, write_weights
from omniwalk.models.common.checkpoint.weights import checkpoint_files
from omniwalk.models.qwen2_5_omni import PRESETS
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen2_5_omni.checkpoint.loader import checkpoint_layout
from omniwalk.models.qwen2_5_omni.networks.token2wav import Token2Wav, initial_noise
from omniwalk.models.qwen2_5_omni.processing.media_inputs import CLIP_MEAN, CLIP_STD

TINY_CONFIG = Path(__file__).with_name("tiny_config.json")
load_config_dict = functools.partial(tiny.load_config_dict, presets=PRESETS, tiny_config=TINY_CONFIG)
SPECIAL_NAMES = {
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "vision_start": "<|vision_bos|>",
    "vision_end": "<|vision_eos|>",
    "image_pad": "<|IMAGE|>",
    "video_pad": "<|VIDEO|>",
    "audio_start": "<|audio_bos|>",
    "audio_end": "<|audio_eos|>",
    "audio_pad": "<|AUDIO|>",
    "tts_pad": "<|tts_pad|>",
    "tts_bos": "<|tts_bos|>",
    "tts_eos": "<|tts_eos|>",
}
# The published vocabulary's added tokens that are not special (decoding keeps them as text).
TEXT_TOKENS = {"<tool_call>": 151657, "</tool_call>": 151658}
SPEAKERS = {"Chelsie": 151870, "Ethan": 151871}  # name -> the talker's text bos (a thinker id), tiny checkpoints
REF_MEL_FRAMES = 30
TOKEN2WAV = "token2wav."
CALIBRATION_CODES = 40  # codec ids of the reference decode


def make_tiny_checkpoint(
    out_dir: str | Path,
    config: str | Path | dict | None = None,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    with_weights: bool = True,
) -> Path:
    """Write a checkpoint for ``config`` (default: the packaged tiny config) into ``out_dir``."""
    raw = load_config_dict(config)
    cfg = Qwen25OmniConfig.from_hf(raw)  # validates before anything is written
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw.setdefault("model_type", "qwen2_5_omni")
    raw.setdefault("architectures", ["Qwen2_5OmniForConditionalGeneration"])
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    if with_weights:
        write_weights(out, checkpoint_layout(cfg), seed, dtype, max_shard_bytes)
    if cfg.enable_audio_output:
        write_speakers(out, raw, seed)
        if with_weights:
            write_token2wav(out, cfg, seed)
    write_tokenizer_files(out, cfg)
    return out


def write_speakers(out: Path, raw: dict, seed: int) -> None:
    """``spk_dict.pt`` with random conditions sized from ``token2wav_config.dit_config``."""
    dit = raw["token2wav_config"].get("dit_config") or {}
    g = torch.Generator().manual_seed(seed + 7)
    speakers = {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, dit.get("enc_emb_dim", 192), generator=g),
            "ref_mel": torch.randn(1, REF_MEL_FRAMES, dit.get("mel_dim", 80), generator=g),
        }
        for name, bos in SPEAKERS.items()
    }
    torch.save(speakers, out / "spk_dict.pt")


@torch.inference_mode()
def write_token2wav(out: Path, cfg: Qwen25OmniConfig, seed: int) -> None:
    """Replace the written ``token2wav.*`` tensors with ``audible_token2wav``'s (module docstring)."""
    token2wav = Token2Wav(cfg.token2wav).eval()
    audible_token2wav(token2wav, next(iter(torch.load(out / "spk_dict.pt", weights_only=True).values())), seed)
    state = {TOKEN2WAV + name: t for name, t in token2wav.state_dict().items()}
    files = checkpoint_files(out)
    for path in sorted({files[name] for name in state}):
        tensors = load_file(str(path))
        for name in tensors.keys() & state.keys():
            tensors[name] = state[name].to(tensors[name].dtype)
        save_file(tensors, str(path), metadata={"format": "pt"})


@torch.inference_mode()
def audible_token2wav(token2wav: Token2Wav, speaker: dict, seed: int) -> None:
    """Random weights in place that keep every input audible: matrices ~ N(0, 1/fan_in), vectors ~
    N(0, 0.2^2), codec embeddings ~ N(0, 1) (codes matter as much as the noise), then ``conv_post``
    scaled so a decode of random codes (``speaker``, a spk_dict entry; 4 ODE steps) peaks at 0.5."""
    for i, (name, p) in enumerate(token2wav.named_parameters()):
        g = torch.Generator().manual_seed(seed * 1000 + i)
        scale = 1.0 if "codec_embed" in name else p[0].numel() ** -0.5 if p.dim() >= 2 else 0.2
        p.copy_((torch.randn(p.shape, generator=g) * scale).to(p.device))
    dit, g = token2wav.cfg.dit, torch.Generator().manual_seed(seed + 11)
    device = token2wav.bigvgan.conv_post.weight.device
    codes = torch.randint(0, dit.num_embeds, (CALIBRATION_CODES,), generator=g).to(device)
    noise = initial_noise(seed, CALIBRATION_CODES * dit.repeats, dit.mel_dim, device)
    cond, ref_mel = (speaker[k].to(device) for k in ("cond", "ref_mel"))
    peaks = []
    hook = token2wav.bigvgan.conv_post.register_forward_hook(lambda m, args, out: peaks.append(out.abs().max().item()))
    token2wav(codes, token2wav.speaker_rows(cond, ref_mel), noise, 4)
    hook.remove()
    token2wav.bigvgan.conv_post.weight.mul_(0.5 / peaks[0])


def write_tokenizer_files(out: Path, cfg: Qwen25OmniConfig) -> None:
    processor = "Qwen2_5OmniProcessor", "Qwen2VLImageProcessor"
    preprocessor = tiny.preprocessor_config(*processor, cfg.audio.num_mel_bins, cfg.vision, CLIP_MEAN, CLIP_STD)
    max_length = cfg.text.max_position_embeddings
    tiny.write_tokenizer_files(out, cfg.tokens, SPECIAL_NAMES, max_length, "Qwen2Tokenizer", preprocessor, TEXT_TOKENS)
