"""Qwen3-Omni for the tests: make-tiny checkpoints, an ``Omni`` per checkpoint, the requests the tests share
(text, media, speech) and HF's inputs for the same media; the walk's workload, the GPU workload, and an
audio-like HF Code2Wav.

The walk runtime's workload on tiny Qwen3-Omni: requests on every input and output path, each run alone
or staggered among the others, and the checks that outputs match and everything is freed.

A tiny Qwen3-Omni on the GPU (bf16, CUDA graphs up to a batch size) and a mixed text and speech
workload for it.

A random HF Code2Wav made audio-like (amplitudes O(1), peak 0.9 without clipping), so waveform
comparisons see the whole signal."""

import base64
import io
import tempfile
import wave
from functools import cache

import numpy as np
import torch
from helpers.hf_oracle import TEST_ROOT, config_dict

from omniwalk import Omni
from omniwalk.media.mel import log_mel
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint
from omniwalk.models.qwen3_omni.processing.media_inputs import vision_pixels

MESSAGES = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "good morning"},
    {"role": "user", "content": [{"type": "text", "text": "tell me a story about the weather"}]},
]


@cache
def checkpoint(name: str) -> str:
    return str(make_tiny_checkpoint(tempfile.mkdtemp(prefix=f"omni_{name}_", dir=TEST_ROOT), config_dict(name)))


@cache
def omni(name: str = "tiny", **options) -> Omni:
    return Omni(model=checkpoint(name), **options)


def greedy(n=64, **kw):
    return {"messages": MESSAGES, "max_tokens": n, "min_tokens": n, "temperature": 0.0, **kw}


RNG = np.random.default_rng(1)


AUDIO = (0.1 * RNG.standard_normal(16000 * 2 + 300)).astype(np.float32)


IMAGE = RNG.integers(0, 256, (90, 130, 3), dtype=np.uint8)


VIDEO = RNG.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8)


def wav_data_url(samples: np.ndarray) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


IMAGE_B = RNG.integers(0, 256, (64, 224, 3), dtype=np.uint8)


AUDIO_B = (0.1 * RNG.standard_normal(12345)).astype(np.float32)


def _user(*parts):
    return {
        "messages": [
            {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}
        ]
    }


REQUESTS = {
    "audio": _user({"type": "audio", "audio": AUDIO}, "what is said"),
    "image": _user({"type": "image", "image": IMAGE}, "describe it"),
    "image_audio_image": _user(
        {"type": "image", "image": IMAGE_B},
        "first",
        {"type": "audio", "audio": AUDIO_B},
        {"type": "image", "image": IMAGE},
        "compare",
    ),
    "multi_turn": {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": IMAGE}, {"type": "text", "text": "what is it"}]},
            {"role": "assistant", "content": "a picture"},
            {"role": "user", "content": "are you sure"},
        ]
    },
    "audio_image": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "audio", "audio": AUDIO},
                    {"type": "image", "image": IMAGE},
                    {"type": "text", "text": "what is it"},
                ],
            }
        ]
    },
    "video": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "video", "video": VIDEO, "fps": 2.0}, {"type": "text", "text": "describe"}],
            }
        ]
    },
    "audio_in_video": {
        "use_audio_in_video": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": VIDEO, "fps": 1.0, "audio": AUDIO},
                    {"type": "text", "text": "listen"},
                ],
            }
        ],
    },
}


def hf_inputs(prompt, use_audio_in_video: bool, pixels=vision_pixels, zero_tail: bool = False) -> dict:
    """HF thinker inputs for our prompt: the same ids and the same preprocessed media (``pixels`` and
    ``zero_tail``: the family's ``vision_pixels`` and ``log_mel`` option; Qwen3-Omni's by default)."""
    items = prompt.items
    ids = torch.tensor([prompt.token_ids])
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_audio_in_video": use_audio_in_video}
    waves = [i.data["audio"] for i in items if i.kind == "audio" or (use_audio_in_video and i.num_audio_tokens)]
    if waves:
        features, frames = log_mel([torch.from_numpy(w) for w in waves], zero_tail=zero_tail)
        out["input_features"] = features
        out["feature_attention_mask"] = (torch.arange(features.shape[-1])[None] < frames[:, None]).long()
    for kind, key, grid in (
        ("image", "pixel_values", "image_grid_thw"),
        ("video", "pixel_values_videos", "video_grid_thw"),
    ):
        chosen = [i for i in items if i.kind == kind]
        if chosen:
            out[key] = torch.cat([pixels(i, "cpu") for i in chosen])
            out[grid] = torch.tensor([i.grid_thw for i in chosen])
    if any(i.kind == "video" for i in items):
        out["video_second_per_grid"] = torch.tensor([i.seconds_per_grid for i in items if i.kind == "video"])
    return out


TEXT_TOKENS, FRAMES = 10, 32


def greedy_speech(messages, voice="ethan", **extra):
    return {
        "messages": messages,
        "modalities": ["text", "audio"],
        "voice": voice,
        "max_tokens": TEXT_TOKENS,
        "min_tokens": TEXT_TOKENS,
        "temperature": 0.0,
        "talker_temperature": 0.0,
        "code_predictor_temperature": 0.0,
        "min_audio_frames": FRAMES,
        "max_audio_frames": FRAMES,
        **extra,
    }


@torch.no_grad()
def hf_speech(model, inputs: dict, voice: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """HF's greedy speech as :func:`greedy_speech` asks ours (``TEXT_TOKENS`` thinker tokens, ``FRAMES``
    frames) -> (generated ids, codes [F, G], waveform)."""
    captured = {}
    decode = model.code2wav.chunked_decode

    def keep(codes, **kwargs):
        captured["codes"] = codes[0].T.clone()
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = keep
    try:
        seq, wav = model.generate(
            **inputs,
            speaker=voice,
            thinker_max_new_tokens=TEXT_TOKENS,
            thinker_min_new_tokens=TEXT_TOKENS,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=FRAMES + 1,  # the last group-0 code never gets its residual codes
            talker_min_new_tokens=FRAMES + 1,
        )
    finally:
        del model.code2wav.chunked_decode
    return seq[0, inputs["input_ids"].shape[1] :].tolist(), captured["codes"], wav.reshape(-1)


PATHS = ("t2t", "s2t", "i2t", "v2t", "t2s", "s2s", "i2s", "v2s", "si2s")


@cache
def walk_omni(**options) -> Omni:
    """The walk's own ``Omni`` (a cache apart from :func:`omni`'s: the walk tests never share an engine with
    the others)."""
    return Omni(model=checkpoint("tiny"), **options)


def make_request(i: int, path: str, seed: int = 0, sampled: bool = False) -> dict:
    rng = np.random.default_rng(1000 * seed + i)
    content = [{"type": "text", "text": " ".join(["tell", "me", "about", "the", "world"][: 1 + i % 5])}]
    if "s" in path.split("2")[0]:
        content.append(
            {"type": "audio", "audio": (0.1 * rng.standard_normal(int(16000 * (0.5 + i % 3 * 0.7)))).astype(np.float32)}
        )
    if "i" in path.split("2")[0]:
        content.append({"type": "image", "image": rng.integers(0, 256, (40 + 10 * (i % 4), 70, 3), dtype=np.uint8)})
    if "v" in path.split("2")[0]:
        content.append({"type": "video", "video": rng.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8), "fps": 2.0})
    n = 3 + (7 * i) % 11
    request = {
        "request_id": f"r{i}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0.8 if sampled else 0.0,
        "seed": i,
    }
    if path.endswith("2s"):
        frames = 4 + (5 * i) % 23
        request.update(
            modalities=["text", "audio"],
            voice=("ethan", "chelsie", "aiden")[i % 3],
            max_audio_frames=frames,
            min_audio_frames=frames,
        )
        if not sampled:
            request.update(talker_temperature=0.0, code_predictor_temperature=0.0)
    return request


def workload(n: int = 24, **kw) -> list[dict]:
    return [make_request(i, PATHS[i % len(PATHS)], **kw) for i in range(n)]


@cache
def alone(i: int, sampled: bool = False):
    return walk_omni().generate(make_request(i, PATHS[i % len(PATHS)], sampled=sampled))


def run_staggered(o: Omni, requests: list[dict], every: int = 2, on_step=None) -> dict:
    pending, reqs, step = list(requests), {}, 0
    while pending or o.engine.has_unfinished():
        if pending and step % every == 0:
            r = o.add(pending.pop(0))
            reqs[r.id] = r
        o.engine.step()
        if on_step:
            on_step(o, step, reqs)
        step += 1
    return {rid: o.output(r) for rid, r in reqs.items()}


def run_failing(o: Omni, program, method: str, fails, requests: list[dict], **run) -> dict:
    """``run_staggered`` with ``program.<method>`` raising RuntimeError("injected failure") wherever
    ``fails(*its arguments)`` holds (the method restored after); the outputs by request id."""
    original = getattr(program, method)

    def flaky(*args):
        if fails(*args):
            raise RuntimeError("injected failure")
        return original(*args)

    setattr(program, method, flaky)
    try:
        return run_staggered(o, requests, **run)
    finally:
        delattr(program, method)


def assert_only_failed(outs: dict, failed: str, requests: list[dict], alone, same) -> None:
    """The injected failure ended ``failed`` alone: an error naming it; every other output ``same`` as alone."""
    assert outs[failed].finish_reason == "error" and "injected failure" in outs[failed].error
    for i, request in enumerate(requests):
        if request["request_id"] != failed:
            same(outs[request["request_id"]], alone(i))


def run_aborting(o: Omni, requests: list[dict], abort_at: dict[str, int]) -> tuple[dict, set]:
    """``run_staggered`` (a request every 2 steps) aborting request ``r<i>`` from ``at`` steps after it
    arrives (``abort_at``: id -> at) while it runs -> (the outputs by request id, the ids aborted)."""
    aborted = set()

    def maybe_abort(o, step, reqs):
        for rid, at in abort_at.items():
            if rid in reqs and rid not in aborted and step >= 2 * int(rid[1:]) + at:
                aborted.add(rid) if o.abort(rid) else None

    return run_staggered(o, requests, on_step=maybe_abort), aborted


def assert_only_aborted(outs: dict, aborted: set, requests: list[dict], alone, same) -> None:
    """Each aborted request ended "abort"; every other output ``same`` as alone."""
    for i, request in enumerate(requests):
        rid = request["request_id"]
        if rid in aborted:
            assert outs[rid].finish_reason == "abort"
        else:
            same(outs[rid], alone(i))


def assert_same(out, ref, exact_audio: bool = False):
    """Ids, text and codes identical; audio bit for bit when the vocoder decoded every stream alone
    (``vocoder_max_batch=1``), else to float rounding (convolutions round differently per batch size)."""
    assert out.token_ids == ref.token_ids and out.text == ref.text and out.finish_reason == ref.finish_reason
    if ref.codes is not None:
        assert torch.equal(out.codes, ref.codes)
        assert out.audio.shape == ref.audio.shape
        assert torch.equal(out.audio, ref.audio) if exact_audio else (out.audio - ref.audio).abs().max() <= 1e-5


def assert_idle(o: Omni):
    for stage in o.engine.stages.values():
        if hasattr(stage, "pool"):
            assert stage.pool.num_used == 0 and not stage.running and not stage.waiting and not stage.tables
        else:
            assert not stage.requests
    if "vocoder" in o.engine.stages:  # every stream slot of the vocoder's state pool is free again
        program = o.engine.stages["vocoder"].program
        assert not program.slots and sorted(program.free) == list(range(program.scratch))
    assert not o.engine.requests


def gpu_omni(graphs: int, **options):

    from omniwalk import Omni

    return Omni(
        model=checkpoint("tiny"),
        device="cuda",
        dtype="bfloat16",
        cuda_graph_max_batch=graphs,
        thinker_kv_bytes=64 * 2**20,
        talker_kv_bytes=16 * 2**20,
        **options,
    )


def gpu_requests():
    words = "tell me a long story about the sea and the ships and the people".split()
    text = [
        {
            "messages": [{"role": "user", "content": " ".join(words[: 3 + i])}],
            "max_tokens": 24,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 2,
        }
        for i in range(4)
    ]
    for i, r in enumerate(text):
        r.update(temperature=0.0) if i % 2 == 0 else r.update(temperature=0.8, seed=7 + i)
    speech = [
        {
            **r,
            "modalities": ["text", "audio"],
            "min_audio_frames": 33,  # vocoder chunks of 5, 5, 10 and a last 13 (padded to 20)
            "max_audio_frames": 33,
            "talker_temperature": 0.0 if i % 2 == 0 else 0.9,
            "code_predictor_temperature": 0.0 if i % 2 == 0 else 1.0,
            "seed": 100 + i,
        }
        for i, r in enumerate(text)
    ]
    return text + speech  # 8 thinker rows, 4 talker rows: both exact buckets


def _scale_conv(conv, factor: float) -> None:
    conv.weight.mul_(factor)
    conv.bias.mul_(factor)


@torch.no_grad()
def make_audio_like_(code2wav, codes: torch.Tensor) -> None:
    """Make a random HF code2wav audio-like, in place; ``codes`` [B, Q, F] calibrate it.

    HF's random init grows the decoder's intermediate amplitudes to ~40 and clips ~90% of the
    output, which hides most of the waveform from a comparison and amplifies fp32 rounding
    ~1000x. Halving the decoder conv weights keeps amplitudes O(1); the last conv (linear in its
    weight and bias together) is then scaled so the waveform peaks at 0.9 without clipping.
    """
    for m in code2wav.decoder.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            _scale_conv(m, 0.5)
    _scale_conv(code2wav.decoder[-1].conv, 1e-3)
    peak = code2wav(codes).abs().max().item()
    assert peak < 0.9, "calibration run clipped"
    _scale_conv(code2wav.decoder[-1].conv, 0.9 / peak)
