"""The talker: a MoE LM over codec ids that speaks the thinker's answer, one codec frame per step.

Per frame (HF ``Qwen3OmniMoeTalkerForConditionalGeneration`` and its code predictor), with ``h``
the talker's final-normed hidden state at its last position:

    c0        = sample(codec_head(h))      group 0; ids >= vocab - 1024 except codec EOS suppressed
    c1..c_G-1 = code predictor([h, emb0(c0)])   a small dense LM with a fresh KV cache per frame:
                position g+1 reads group g's embedding, lm_head[g] predicts group g+1
    next in   = emb0(c0) + sum_g cp_emb[g-1](c_g) + text stream entry (or tts_pad once it is spent)

Generation stops when c0 is codec EOS (not a frame) or after ``max_audio_frames`` frames; EOS is
masked until ``min_audio_frames`` frames exist. Talker and code-predictor sampling are separate
(``TalkerSamplingParams``); temperature 0 is greedy. Module names mirror the checkpoint under
``talker.`` (``model.codec_embedding``, ``model.layers.N.*``, ``codec_head``, ``text_projection.*``,
``code_predictor.model.codec_embedding.j``, ``code_predictor.lm_head.j``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from omniwalk.device import to_device
from omniwalk.errors import InvalidRequestError
from omniwalk.kernels.registry import DECODE_ATTENTION
from omniwalk.layers.decoder import Decoder, DecoderConfig, RowsKVCache
from omniwalk.layers.linear import MergesProjections, SkinnyLinear
from omniwalk.layers.rotary import rotary_tables
from omniwalk.models.qwen3_omni.checkpoint.config import TalkerConfig
from omniwalk.sampling import BatchParams, SamplingParams, draw

# (logits [B, vocab], draw index 0..G-2 within the frame) -> ids [B] on the device
SampleFn = Callable[[torch.Tensor, int], torch.Tensor]
NUM_SUPPRESSED_CODEC_IDS = 1024  # the codec vocabulary's top ids are control codes, never sampled


@dataclass(frozen=True)
class TalkerSamplingParams:
    """Per-request speech sampling; defaults are HF's (``Qwen3OmniMoeForConditionalGeneration.generate``)."""

    talker_temperature: float = 0.9
    talker_top_k: int = 50
    talker_top_p: float = 1.0
    talker_repetition_penalty: float = 1.05  # over the request's earlier group-0 codes only
    code_predictor_temperature: float = 1.0
    code_predictor_top_k: int = 50
    code_predictor_top_p: float = 0.8
    max_audio_frames: int = 4096
    min_audio_frames: int = 0  # codec EOS is masked until this many frames exist
    seed: int | None = None

    def __post_init__(self):
        if not 0 <= self.min_audio_frames <= self.max_audio_frames:
            raise InvalidRequestError("min_audio_frames must be in [0, max_audio_frames]")
        # Building the two SamplingParams validates every sampling field (InvalidRequestError).
        self.talker()
        self.code_predictor()

    @classmethod
    def from_request(cls, request: dict) -> TalkerSamplingParams:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in request.items() if k in names and v is not None})

    def talker(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_audio_frames,
            temperature=self.talker_temperature,
            top_k=self.talker_top_k,
            top_p=self.talker_top_p,
            repetition_penalty=self.talker_repetition_penalty,
            min_tokens=self.min_audio_frames,
            seed=self.seed,
        )

    def code_predictor(self) -> SamplingParams:
        seed = None if self.seed is None else self.seed + 1
        return SamplingParams(
            temperature=self.code_predictor_temperature,
            top_k=self.code_predictor_top_k,
            top_p=self.code_predictor_top_p,
            seed=seed,
        )


class ResizeMLP(nn.Module):
    """thinker hidden -> talker hidden: ``fc2(silu(fc1(x)))`` (both with bias)."""

    def __init__(self, in_size: int, intermediate_size: int, out_size: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(in_size, intermediate_size)
        self.linear_fc2 = nn.Linear(intermediate_size, out_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


def embed_add_reference(
    table: torch.Tensor, ids: torch.Tensor, total: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """table [V, H], ids [B], total [B, H] -> (table[ids], total + table[ids]): the code predictor's
    per-group step (the oracle of ``kernels/embed_add.py``)."""
    embedding = F.embedding(ids, table)
    return embedding, total + embedding


class TalkerModel(Decoder):
    def __init__(self, cfg: DecoderConfig, moe_backend: str = "reference"):
        super().__init__(cfg, moe_backend)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class CodePredictorModel(Decoder):
    def __init__(self, cfg: DecoderConfig, num_code_groups: int):
        super().__init__(cfg)
        # codec_embedding[g - 1] embeds group g (group 0 uses the talker's codec_embedding)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, cfg.hidden_size) for _ in range(num_code_groups - 1)
        )


class CodePredictor(MergesProjections):
    def __init__(self, cfg: DecoderConfig, num_code_groups: int):
        super().__init__()
        self.cfg, self.num_code_groups = cfg, num_code_groups
        self.model = CodePredictorModel(cfg, num_code_groups)
        # lm_head[g - 1] predicts group g
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(num_code_groups - 1)
        )
        self._table_cache: dict = {}
        # the per-group embedding step and the one-token passes' decode attention (None: the rows' own);
        # the fused kernels' forms once ``merge_projections`` ran
        self.embed_add: Callable = embed_add_reference
        self.paged_decode: Callable | None = None
        self.persistent: Callable | None = None  # a frame in one launch (``use_persistent_kernel``)

    def forward(self, talker_hidden: torch.Tensor, code0_embedding: torch.Tensor, sample: SampleFn):
        """Groups 1..G-1 of a batch of frames, each row with a fresh short KV.

        talker_hidden, code0_embedding [B, hidden]; ``sample(logits [B, vocab], i) -> ids [B]`` draws
        group i + 1 for every row on the device. -> (codes [B, G-1] int64 on the device, the sum of
        their embeddings [B, hidden]).
        """
        b, p = talker_hidden.shape[0], self.lm_head[0].weight
        cfg = self.cfg
        embed_add = self.embed_add
        cache = RowsKVCache(
            b,
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
            p.dtype,
            p.device,
            self.num_code_groups + 1,
            self.paged_decode,
        )
        x = torch.stack([talker_hidden, code0_embedding], dim=1).reshape(2 * b, -1)  # row-major [B * 2]
        h = self.model(x, torch.arange(2, device=p.device).repeat(b), cache).view(b, 2, -1)[:, -1]
        logits = self.lm_head[0](h)
        codes, total = [], torch.zeros_like(talker_hidden)
        for group in range(1, self.num_code_groups):
            code = sample(logits, group - 1)
            codes.append(code)
            embedding, total = embed_add(self.model.codec_embedding[group - 1].weight, code, total)
            if group < self.num_code_groups - 1:
                head = self.lm_head[group]
                logits = self.model(embedding, None, cache, tables=self._tables(group + 1, p), head=head)
        return torch.stack(codes, dim=1), total

    def draw_groups(self, talker_hidden: torch.Tensor, code0_embedding: torch.Tensor, params: BatchParams):
        """``forward`` with group g drawn by ``sampling.draw(logits, params, g - 1)``: in one launch of the
        persistent kernel where it was made and the batch is small enough, else pass by pass."""
        if self.persistent is not None and talker_hidden.shape[0] <= self.persistent.max_batch:
            return self.persistent(talker_hidden, code0_embedding, params)
        return self(talker_hidden, code0_embedding, lambda logits, i: draw(logits, params, i))

    def use_persistent_kernel(self, kind: str = "triton") -> None:
        """``persistent_decode="triton"``: frames of a few requests run ``kernels/persistent.py``'s kernel;
        ``"cuda"``: ``kernels/cuda_frame.py``'s (after the decoder kernels; each stacks the loaded weights,
        the modules keep views of them)."""
        from omniwalk.kernels.frame import capacity
        from omniwalk.kernels.persistent import PersistentCodePredictor

        if kind == "cuda":
            from omniwalk.kernels.cuda_frame import CudaCodePredictor as frame
        else:
            frame = PersistentCodePredictor
        p = self.lm_head[0].weight
        positions = torch.arange(capacity(self.num_code_groups), device=p.device)
        cos, sin = rotary_tables(*self.model.rotary(positions), p.dtype)
        self.persistent = frame(self, cos[:, 0], sin[:, 0])

    def merge_projections(self) -> None:
        """Fused kernels (``decoder.use_fused_kernels``, after loading): the heads become skinny GEMVs, which
        take the decoder's final norm into their prologue at one row (``SkinnyLinear.normed``); the
        embedding step is one kernel and one-token passes attend with the paged decode kernel."""
        from omniwalk.kernels.embed_add import embed_add_triton

        self.embed_add = embed_add_triton
        self.paged_decode = DECODE_ATTENTION.load("triton")
        self.lm_head = nn.ModuleList(SkinnyLinear.merge(head) for head in self.lm_head)

    def _tables(self, position: int, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables of one position [1, 1, head_dim] (broadcast over the rows), made once."""
        key = (position, p.dtype, p.device)
        if key not in self._table_cache:
            positions = to_device([position], p.device, torch.long)
            self._table_cache[key] = rotary_tables(*self.model.rotary(positions), p.dtype)
        return self._table_cache[key]


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig, moe_backend: str = "reference"):
        super().__init__()
        self.cfg = cfg
        text = cfg.text
        self.model = TalkerModel(text, moe_backend)
        self.codec_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.text_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.num_code_groups)
        suppressed = torch.arange(text.vocab_size) >= text.vocab_size - NUM_SUPPRESSED_CODEC_IDS
        suppressed[cfg.codec.eos] = False
        self.register_buffer("suppressed", suppressed, persistent=False)

    def group0_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [hidden] -> codec logits [vocab] with control codes (not EOS) at -inf."""
        return self.codec_head(hidden).float().masked_fill(self.suppressed, -float("inf"))
