"""One request at a time, outside the engine: the loops component tests compare with HF.

The package runs every request through the engine's programs; these are the plain per-request
forms of the same steps (a contiguous KV cache, a sampler of one, the talker's whole prompt built
after the thinker finished and its frame loop, a streaming vocoder of one), so a component's
parity with HF is tested apart from the scheduling around it.

Run as a script, it is one rank of the tensor-parallel logits test (``test_tensor_parallel.py``):

    python tests/helpers/single_request.py RANK WORLD STORE CKPT OUT

it loads the thinker, keeps this rank's share (``shard_decoder``; none with WORLD 1), runs a prompt and
greedy decode steps over a contiguous KV cache (``thinker_logits``), and (rank 0) saves every step's
logits to OUT.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from omniwalk.errors import InvalidRequestError
from omniwalk.layers.decoder import DecoderConfig
from omniwalk.layers.kv_attention import causal_attention
from omniwalk.media.patches import VIDEO_PATCHES, PatchSpec, resize_video, resized_video_patches
from omniwalk.models.common.checkpoint.config import TokenIds
from omniwalk.models.common.processing.positions import MediaSpan, RopePositions
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig
from omniwalk.models.qwen3_omni.networks.talker import Talker, TalkerSamplingParams
from omniwalk.models.qwen3_omni.processing.talker_prompt import talker_prefix
from omniwalk.parallel.layers import local_heads, shard_decoder
from omniwalk.sampling import SamplerState, SamplingParams, TokenLogprob, process, sample, sample_on_device


class ContiguousKVCache:
    """One contiguous buffer per layer, [kv_heads, capacity, head_dim], doubled when full."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device, capacity=256):
        self.num_tokens = 0
        shape = (num_kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @classmethod
    def for_config(cls, cfg: DecoderConfig, dtype: torch.dtype, device) -> ContiguousKVCache:
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_all, v_all = self.append(layer, k.transpose(0, 1), v.transpose(0, 1))
        return causal_attention(q.transpose(0, 1), k_all, v_all).transpose(0, 1)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [kv_heads, new, d] -> all keys/values [kv_heads, num_tokens + new, d]."""
        end = self.num_tokens + k.shape[1]
        if end > self.keys[layer].shape[1]:
            self.keys[layer] = _grow(self.keys[layer], end, self.num_tokens)
            self.values[layer] = _grow(self.values[layer], end, self.num_tokens)
        self.keys[layer][:, self.num_tokens : end] = k
        self.values[layer][:, self.num_tokens : end] = v
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def advance(self, num_new: int) -> None:
        self.num_tokens += num_new

    def kv_slots(self, layer: int, num_new: int) -> None:
        return None


def _grow(buf: torch.Tensor, needed: int, used: int) -> torch.Tensor:
    capacity = buf.shape[1]
    while capacity < needed:
        capacity *= 2
    out = buf.new_empty((buf.shape[0], capacity, buf.shape[2]))
    out[:, :used] = buf[:, :used]
    return out


class Sampler:
    """One request's sampler: ``sampler(logits [V]) -> TokenLogprob`` (a batch of one)."""

    def __init__(self, params: SamplingParams, eos_token_ids: tuple[int, ...], prompt_ids: list[int]):
        self.state = SamplerState(params, eos_token_ids, prompt_ids)
        self.params = params

    def is_stop_token(self, token_id: int) -> bool:
        return self.state.is_stop_token(token_id)

    def processed(self, logits: torch.Tensor) -> torch.Tensor:
        return process(logits[None], [self.state])[0]

    def __call__(self, logits: torch.Tensor) -> TokenLogprob:
        return sample(logits[None], [self.state])[0]


@dataclass
class TalkerPrompt:
    """What the talker needs from the thinker for one request, once the thinker has finished."""

    embeddings: torch.Tensor  # [P, hidden] prefill inputs (projected user turns + 9-position header)
    positions: RopePositions  # [3, P] and the decode delta
    text_stream: torch.Tensor  # [T, hidden] one projected text entry per frame after the first; ends with tts_eos
    tts_pad: torch.Tensor  # [hidden] added once the text stream is spent


@torch.inference_mode()
def build_talker_prompt(
    talker: Talker,
    tokens: TokenIds,
    *,
    prompt_ids: list[int],
    generated_ids: list[int],
    embeddings: torch.Tensor,
    accept_hidden: torch.Tensor,
    special_embeddings: torch.Tensor,
    spans: list[MediaSpan],
    speaker: int,
    position_id_per_seconds: float,
) -> TalkerPrompt:
    """One request's whole talker prompt. ``embeddings`` / ``accept_hidden`` are [L, thinker_hidden]
    for the first L positions of prompt + generated ids (L must cover the first generated token)."""
    p = talker.codec_head.weight
    num_prompt = len(prompt_ids)
    if embeddings.shape[0] <= num_prompt or not generated_ids:
        raise InvalidRequestError("speech output needs at least one generated text token")
    inputs, positions = talker_prefix(
        talker,
        tokens,
        prompt_ids=prompt_ids,
        embeddings=embeddings[:num_prompt],
        accept_hidden=accept_hidden[:num_prompt],
        first_answer=embeddings[num_prompt],
        special_embeddings=special_embeddings,
        spans=spans,
        speaker=speaker,
        position_id_per_seconds=position_id_per_seconds,
    )
    _, eos, pad = talker.text_projection(special_embeddings.to(p)).unbind(0)
    spoken = generated_ids.index(tokens.im_end) if tokens.im_end in generated_ids else len(generated_ids)
    # generated token k (k >= 1) is spoken with frame k, up to (not including) a thinker EOS; then tts_eos once
    stream = talker.text_projection(embeddings[num_prompt + 1 : num_prompt + spoken].to(p))
    return TalkerPrompt(inputs, positions, torch.cat([stream, eos[None]]), pad)


@torch.inference_mode()
def talker_generate(talker: Talker, prompt: TalkerPrompt, params: TalkerSamplingParams) -> Iterator[torch.Tensor]:
    """Yield each complete frame's codes [G] int64 (group 0 first) until codec EOS or the frame limit."""
    p, cfg = talker.codec_head.weight, talker.cfg
    embed0 = talker.model.codec_embedding
    cache = ContiguousKVCache.for_config(cfg.text, p.dtype, p.device)
    h = talker.model(prompt.embeddings.to(p), prompt.positions.positions.to(p.device), cache)[-1]
    talker_sampler = Sampler(params.talker(), (cfg.codec.eos,), [])
    cp_state = SamplerState(params.code_predictor(), (), [])

    def cp_sample(logits: torch.Tensor, _: int) -> torch.Tensor:
        return sample_on_device(logits, [cp_state])

    num_prompt = prompt.embeddings.shape[0]
    for frame in range(params.max_audio_frames):
        code0 = talker_sampler(talker.group0_logits(h)).token_id
        if code0 == cfg.codec.eos:
            return
        code0_embedding = embed0(torch.tensor(code0, device=p.device))
        rest, rest_sum = talker.code_predictor(h[None], code0_embedding[None], cp_sample)
        rest, rest_sum = rest[0].cpu(), rest_sum[0]
        yield torch.cat([torch.tensor([code0]), rest])
        if frame + 1 == params.max_audio_frames:
            return
        text = prompt.text_stream[frame] if frame < len(prompt.text_stream) else prompt.tts_pad
        x = code0_embedding + rest_sum + text.to(p)
        h = talker.model(x[None], prompt.positions.decode(num_prompt + frame).to(p.device), cache)[-1]


class VocoderStream:
    """One request's streaming vocoder: frames pushed in, PCM chunks out (chunks as the engine cuts them)."""

    def __init__(self, vocoder: Code2Wav, config: VocoderStreamConfig | None = None):
        self.vocoder, self.config = vocoder, config or VocoderStreamConfig()
        self.state = vocoder.new_state(batch_size=1)
        self.num_decoded_frames = 0
        self._pending: list[torch.Tensor] = []  # frames [T_i, Q] received but not decoded yet

    @property
    def num_pending_frames(self) -> int:
        return sum(len(f) for f in self._pending)

    @torch.inference_mode()
    def push(self, frames: torch.Tensor) -> list[torch.Tensor]:
        """Add codec frames [T, Q] (T >= 0); return the PCM chunks [samples] float32 now complete."""
        self._pending.append(frames)
        chunks = []
        while self.num_pending_frames >= self.config.next_chunk(self.num_decoded_frames):
            chunks.append(self._decode(self.config.next_chunk(self.num_decoded_frames)))
        return chunks

    @torch.inference_mode()
    def finish(self) -> torch.Tensor:
        """Decode the frames of a last partial chunk (possibly none: an empty tensor)."""
        if not self.num_pending_frames:
            return torch.zeros(0, dtype=torch.float32)
        return self._decode(self.num_pending_frames)

    def _decode(self, num_frames: int) -> torch.Tensor:
        frames = torch.cat(self._pending)
        self._pending = [frames[num_frames:]]
        device = self.vocoder.code_embedding.weight.device
        wav = self.vocoder.decode(frames[None, :num_frames].to(device), self.state)
        self.num_decoded_frames += num_frames
        return wav[0].float()


def chunk_schedule(config: VocoderStreamConfig, num_frames: int) -> list[int]:
    """The frames of each chunk a stream of ``num_frames`` frames is cut into (its last one short)."""
    sizes = []
    while (done := sum(sizes)) < num_frames:
        sizes.append(min(config.next_chunk(done), num_frames - done))
    return sizes


def decode_in_chunks(vocoder: Code2Wav, codes: torch.Tensor, chunk_frames: int = 300) -> torch.Tensor:
    """One-shot equivalent of ``vocoder(codes[None])[0]`` for codes [F, Q] in bounded memory."""
    stream = VocoderStream(vocoder, VocoderStreamConfig(chunk_frames=chunk_frames, first_chunk_frames=chunk_frames))
    return torch.cat([*stream.push(codes), stream.finish()])


def video_patches(frames: torch.Tensor, spec: PatchSpec = VIDEO_PATCHES) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, H, W, 3] sampled frames -> resized, normalised patches and grid."""
    return resized_video_patches(resize_video(frames, spec), spec)


PROMPT, STEPS = 23, 12


@torch.inference_mode()
def thinker_logits(rank: int, world: int, ckpt: str) -> torch.Tensor:
    """[PROMPT + STEPS - 1, vocab]: the prompt's logits, then each greedy decode step's."""
    transform = (lambda name, module: shard_decoder(module, rank, world)) if world > 1 else None
    thinker = load_components(ckpt, ("thinker",), transform=transform)["thinker"]
    cache = ContiguousKVCache.for_config(local_heads(thinker.cfg, world), torch.float32, "cpu")
    ids = (torch.arange(PROMPT) * 7919 + 11) % thinker.cfg.vocab_size
    rows = [thinker(ids, torch.arange(PROMPT), cache, all_logits=True).logits]
    for step in range(STEPS - 1):
        token = rows[-1][-1:].argmax(-1)
        rows.append(thinker(token, torch.tensor([PROMPT + step]), cache, all_logits=True).logits)
    return torch.cat(rows)


if __name__ == "__main__":  # one rank of the tensor-parallel logits test: RANK WORLD STORE CKPT OUT
    import sys

    import torch.distributed as dist

    rank, world, store, ckpt, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    logits = thinker_logits(rank, world, ckpt)
    if rank == 0:
        torch.save(logits, out)
    dist.destroy_process_group()
