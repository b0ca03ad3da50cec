"""Qwen2.5-Omni for the tests: make-tiny checkpoints, an ``Omni`` and HF's model per checkpoint, the requests
the tests share, HF's inputs for the same media, the walk's workload, and the HF oracle.

The walk runtime's workload on tiny Qwen2.5-Omni: requests on every input path, each run alone, and
the checks that outputs match and KV pages and token2wav rows are freed.

The Qwen2.5-Omni oracle: tiny random HF transformers models, built once per session (tests only)."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import torch
from helpers import qwen3_omni
from helpers.hf_oracle import TEST_ROOT, write_config
from helpers.qwen3_omni import assert_idle

from omniwalk import Omni
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen2_5_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen2_5_omni.processing.media_inputs import vision_pixels

RNG = np.random.default_rng(5)


AUDIO = (0.1 * RNG.standard_normal(16000 * 3 + 123)).astype(np.float32)


AUDIO_B = (0.1 * RNG.standard_normal(9001)).astype(np.float32)


IMAGE = RNG.integers(0, 256, (90, 130, 3), dtype=np.uint8)


IMAGE_B = RNG.integers(0, 256, (60, 200, 3), dtype=np.uint8)


VIDEO = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)


MESSAGES = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "good morning"},
    {"role": "user", "content": [{"type": "text", "text": "tell me a story about the weather"}]},
]


def _user(*parts, **extra):
    content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return {"messages": [{"role": "user", "content": content}], **extra}


REQUESTS = {
    "text": {"messages": MESSAGES},
    "audio": _user({"type": "audio", "audio": AUDIO}, "what is said"),
    "image": _user({"type": "image", "image": IMAGE}, "describe it"),
    "video": _user({"type": "video", "video": VIDEO, "fps": 2.0}, "describe"),
    "image_audio_image": _user(
        {"type": "image", "image": IMAGE_B},
        "first",
        {"type": "audio", "audio": AUDIO_B},
        {"type": "image", "image": IMAGE},
        "compare",
    ),
    "audio_in_video": _user(
        {"type": "video", "video": VIDEO, "fps": 1.0, "audio": AUDIO}, "listen", use_audio_in_video=True
    ),
}


@cache
def checkpoint(name: str) -> str:
    return str(make_tiny_checkpoint(tempfile.mkdtemp(prefix=f"omni25_{name}_", dir=TEST_ROOT), config_dict(name)))


@cache
def omni(name: str = "tiny") -> Omni:
    return Omni(model=checkpoint(name))


@cache
def hf(name: str):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(checkpoint(name)).eval()


def hf_inputs(prompt, use_audio_in_video: bool) -> dict:
    """HF thinker inputs for our prompt: the same ids and the same preprocessed media."""
    return qwen3_omni.hf_inputs(prompt, use_audio_in_video, pixels=vision_pixels, zero_tail=True)


PATHS = ("t2t", "s2t", "i2t", "v2t", "si2t", "av2t")


@cache
def walk_omni(**options) -> Omni:
    """The walk's own ``Omni`` (a cache apart from :func:`omni`'s)."""
    return Omni(model=checkpoint("tiny"), **options)


def make_request(i: int, sampled: bool = False) -> dict:
    path, rng = PATHS[i % len(PATHS)], np.random.default_rng(i)
    inputs = path.split("2")[0]
    content = [{"type": "text", "text": " ".join(["tell", "me", "about", "the", "world"][: 1 + i % 5])}]
    wave = (0.1 * rng.standard_normal(int(16000 * (0.5 + i % 3 * 0.7)))).astype(np.float32)
    if inputs in ("s", "si"):
        content.append({"type": "audio", "audio": wave})
    if "i" in inputs:
        content.append({"type": "image", "image": rng.integers(0, 256, (40 + 10 * (i % 4), 70, 3), dtype=np.uint8)})
    if "v" in inputs:
        video = {"type": "video", "video": rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8), "fps": 2.0}
        content.append({**video, "audio": wave} if "a" in inputs else video)
    request = {
        "request_id": f"r{i}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3 + (7 * i) % 11,
        "ignore_eos": True,
        "temperature": 0.8 if sampled else 0.0,
        "seed": i,
        "use_audio_in_video": "a" in inputs,
    }
    if i % 4 == 3:  # speech; every other one streamed, with 64 codes more (2 to 4 DiT windows of 72 mel frames)
        streamed = i % 8 == 7
        codes = 24 + (29 * i) % 70 + 64 * streamed
        request.update(modalities=["text", "audio"], voice=("Chelsie", "ethan")[i % 2], max_audio_frames=codes)
        request.update(min_audio_frames=codes, talker_temperature=0.9 if sampled else 0.0, stream=streamed)
        request.update(token2wav_num_steps=(3, 4, None)[i % 3])  # (None: the default 10)
    return request


def assert_free(o: Omni):
    """Every stage idle, KV pages free, and token2wav holds no rows (windows being solved) for anyone."""
    assert_idle(o)
    program = o.engine.stages["token2wav"].program
    assert not any(program.rows.values()) and not program.starting


def workload(n: int = 18, **kw) -> list[dict]:
    return [make_request(i, **kw) for i in range(n)]


@cache
def alone(i: int, sampled: bool = False):
    return walk_omni().generate(make_request(i, sampled=sampled))


def assert_same(out, ref):
    """Ids, text and codes identical; audio to float rounding (token2wav's batched ODE steps pad rows
    to the longest: measured max |diff| < 1e-6 at RMS ~0.1)."""
    assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason)
    assert out.codes == ref.codes and (ref.codes is None or len(ref.codes) > 3)
    if ref.codes is not None:
        assert out.audio.shape == ref.audio.shape == (len(ref.codes) * 2 * 240,) and ref.audio.std() > 0.01
        assert (out.audio - ref.audio).abs().max() < 1e-5


PACKAGE_TINY = Path(__file__).parents[2] / "omniwalk" / "models" / "qwen2_5_omni" / "checkpoint" / "tiny_config.json"
# The uneven tiny shape: the package's tiny config with these fields changed (6 heads of 12, 3 layers,
# vision windows of 3 tokens with full attention at blocks 0 and 3, 50-frame audio chunks).
UNEVEN = {
    "thinker_config": {
        "audio_config": {
            "d_model": 24,
            "encoder_layers": 3,
            "encoder_attention_heads": 3,
            "encoder_ffn_dim": 40,
            "output_dim": 72,
            "n_window": 25,
        },
        "vision_config": {
            "depth": 4,
            "hidden_size": 48,
            "num_heads": 4,
            "intermediate_size": 80,
            "out_hidden_size": 72,
            "window_size": 84,
            "fullatt_block_indexes": [0, 3],
        },
        "text_config": {
            "hidden_size": 72,
            "intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "rope_parameters": {"mrope_section": [2, 2, 2]},
        },
    },
    "talker_config": {
        "embedding_size": 72,
        "hidden_size": 24,
        "intermediate_size": 40,
        "num_hidden_layers": 3,
        "num_attention_heads": 3,
        "head_dim": 8,
        "rope_parameters": {"mrope_section": [1, 1, 2]},
    },
    "token2wav_config": {
        "dit_config": {
            "hidden_size": 24,
            "num_hidden_layers": 3,
            "num_attention_heads": 3,
            "head_dim": 8,
            "block_size": 12,
            "look_backward_layers": [0, 2],
        },
        "bigvgan_config": {
            "upsample_initial_channel": 32,
            "resblock_kernel_sizes": [5],
            "resblock_dilation_sizes": [[1, 3, 5]],
            "upsample_rates": [5, 3, 4, 4],
            "upsample_kernel_sizes": [11, 7, 8, 8],
        },
    },
}
# Two shapes: the package's tiny one and the uneven one.
TINY_CONFIGS = {"tiny": PACKAGE_TINY, "uneven": write_config("qwen2_5_tiny_uneven", PACKAGE_TINY, UNEVEN)}


def config_dict(name: str) -> dict:
    return json.loads(TINY_CONFIGS[name].read_text())


@cache
def hf_model(name: str, seed: int = 0):
    """A random HF ``Qwen2_5OmniForConditionalGeneration`` (fp32, eval) for a tiny config."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(Qwen2_5OmniConfig(**config_dict(name))).eval()
    randomize(model, seed + 1)  # HF leaves norms at 1 and biases at 0: parity must not pass by symmetry
    return model


@cache
def hf_checkpoint(name: str, seed: int = 0) -> Path:
    """``save_pretrained`` output of :func:`hf_model` in a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix=f"hf25_{name}_", dir=TEST_ROOT))
    hf_model(name, seed).save_pretrained(out)
    return out
