"""Offline speech output for one request: thinker outputs -> talker codes -> 24 kHz waveform.

``synthesize`` is the hook ``Omni.generate`` calls for ``modalities: ["text", "audio"]`` once the
thinker has finished; the streaming engine uses the same pieces (``build_talker_prompt``,
``Talker.generate``, ``VocoderStream``) step by step instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from omniwalk.models.qwen3_omni.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.code2wav_stream import decode_in_chunks
from omniwalk.models.qwen3_omni.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.mrope import MediaSpan
from omniwalk.models.qwen3_omni.talker import Talker, TalkerSamplingParams
from omniwalk.models.qwen3_omni.talker_prompt import build_talker_prompt, resolve_speaker

SAMPLE_RATE = 24000


@dataclass
class SpeechOutput:
    codes: torch.Tensor  # [frames, num_code_groups] int64, complete frames only (no codec EOS)
    audio: torch.Tensor  # [samples] float32 mono in [-1, 1] at SAMPLE_RATE; samples_per_frame·F - 555 (real config)


@torch.inference_mode()
def synthesize(
    talker: Talker,
    vocoder: Code2Wav,
    cfg: Qwen3OmniConfig,
    embed_tokens: nn.Module,
    *,
    prompt_ids: list[int],
    generated_ids: list[int],
    embeddings: torch.Tensor,
    accept_hidden: torch.Tensor,
    spans: list[MediaSpan],
    voice: str | None = None,
    params: TalkerSamplingParams | None = None,
) -> SpeechOutput:
    """Speak the thinker's answer.

    ``embed_tokens`` is the thinker's input embedding (for the tts_* special tokens);
    ``embeddings`` / ``accept_hidden`` [L, thinker_hidden] are the thinker's decoder input embeddings
    and layer ``accept_hidden_layer - 1`` outputs for every position it ran (prompt + generated ids
    except, normally, the last); ``spans`` are the prompt's media spans; ``params`` default to HF's.
    An unknown ``voice`` raises ``InvalidRequestError`` before any work is done.
    """
    speaker = resolve_speaker(cfg.talker.speaker_ids, voice)
    params = params or TalkerSamplingParams()
    t = cfg.tokens
    special_ids = torch.tensor([t.tts_bos, t.tts_eos, t.tts_pad], device=embed_tokens.weight.device)
    prompt = build_talker_prompt(
        talker,
        t,
        prompt_ids=prompt_ids,
        generated_ids=generated_ids,
        embeddings=embeddings,
        accept_hidden=accept_hidden,
        special_embeddings=embed_tokens(special_ids),
        spans=spans,
        speaker=speaker,
        position_id_per_seconds=cfg.position_id_per_seconds,
    )
    frames = list(talker.generate(prompt, params))
    if not frames:
        return SpeechOutput(torch.zeros(0, cfg.talker.num_code_groups, dtype=torch.long), torch.zeros(0))
    codes = torch.stack(frames)
    return SpeechOutput(codes, decode_in_chunks(vocoder, codes.to(vocoder.code_embedding.weight.device)).cpu())
