"""Config readers both families share: an HF decoder section -> ``DecoderConfig``, and the special
token ids of an omni thinker vocabulary (``TokenIds``). Errors name the field by its JSON path."""

from __future__ import annotations

from dataclasses import dataclass

from omniwalk.errors import ConfigError
from omniwalk.layers.decoder import DecoderConfig, RopeConfig
from omniwalk.models.json_fields import MISSING, Section


@dataclass(frozen=True)
class TokenIds:
    """Special token ids of the thinker vocabulary (read from config.json by each family)."""

    im_start: int
    im_end: int
    system: int
    user: int
    assistant: int
    audio_pad: int
    image_pad: int
    video_pad: int
    audio_start: int
    audio_end: int
    vision_start: int
    vision_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int

    @property
    def media_pads(self) -> tuple[int, int, int]:
        return (self.audio_pad, self.image_pad, self.video_pad)


def read_rope(s: Section, default_theta: float, head_dim: int, multimodal: bool, interleaved: bool) -> RopeConfig:
    """Both spellings: ``rope_parameters`` (transformers >= 5) or ``rope_scaling`` + ``rope_theta``."""
    params = s.data.get("rope_parameters") or {}
    scaling = s.data.get("rope_scaling") or {}
    if params and scaling:
        for key in set(params) & set(scaling):
            if params[key] != scaling[key] and key not in ("type", "rope_type"):
                raise ConfigError(f"{s.name('rope_parameters')}.{key} disagrees with rope_scaling.{key}")
    merged = Section({**scaling, **params}, s.name("rope_parameters" if params else "rope_scaling"))
    rope_type = merged.data.get("rope_type", merged.data.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"{merged.name('rope_type')}: unsupported rope type {rope_type!r}")
    theta = merged.float("rope_theta", s.float("rope_theta", default_theta))
    section = merged.ints("mrope_section", None) if multimodal else None
    if multimodal and section is None:
        raise ConfigError(f"{merged.name('mrope_section')} is required but missing")
    if section is not None and (len(section) != 3 or sum(section) != head_dim // 2):
        raise ConfigError(
            f"{merged.name('mrope_section')} = {list(section)} must have 3 entries summing to "
            f"head_dim/2 = {head_dim // 2}"
        )
    return RopeConfig(theta=theta, mrope_section=section, interleaved=interleaved)


def _read_experts(s: Section, norm_topk_default: bool, shared_required: bool) -> dict:
    """The MoE fields of a decoder section whose every layer is a MoE -> ``DecoderConfig`` keywords."""
    num_experts = s.int("num_experts", s.data.get("num_local_experts", MISSING))
    top_k = s.int("num_experts_per_tok")
    if top_k > num_experts:
        raise ConfigError(f"{s.name('num_experts_per_tok')} ({top_k}) exceeds num_experts ({num_experts})")
    experts = dict(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=s.int("moe_intermediate_size"),
        shared_expert_intermediate_size=s.int(
            "shared_expert_intermediate_size", MISSING if shared_required else 0, minimum=0
        ),
        norm_topk_prob=s.bool("norm_topk_prob", norm_topk_default),
    )
    if s.data.get("mlp_only_layers") or s.int("decoder_sparse_step", 1) != 1:
        raise ConfigError(f"{s.name('mlp_only_layers')}: dense layers inside a MoE stack are not supported")
    return experts


def read_decoder(
    s: Section,
    *,
    theta: float,
    multimodal: bool,
    interleaved: bool = True,
    attention_bias: bool = False,
    moe: bool = False,
    norm_topk_default: bool = True,
    shared_required: bool = False,
) -> DecoderConfig:
    """A decoder section. ``attention_bias``: biased q/k/v and no q/k norm (else q/k norm, no bias);
    ``moe``: every layer a MoE (``shared_required``: with a shared expert)."""
    if s.bool("use_sliding_window", False):
        raise ConfigError(f"{s.name('use_sliding_window')}: sliding-window layers are not supported")
    if s.get("hidden_act", "silu", str) != "silu":
        raise ConfigError(f"{s.name('hidden_act')}: only 'silu' is supported")
    heads = s.int("num_attention_heads")
    hidden = s.int("hidden_size")
    head_dim = s.int("head_dim", hidden // heads)  # NOTE: may differ from hidden/heads
    kv_heads = s.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(
            f"{s.name('num_attention_heads')} ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    if head_dim % 2:
        raise ConfigError(f"{s.name('head_dim')} must be even, got {head_dim}")
    experts = _read_experts(s, norm_topk_default, shared_required) if moe else {}
    return DecoderConfig(
        vocab_size=s.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=s.int("intermediate_size"),
        num_hidden_layers=s.int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=s.float("rms_norm_eps", 1e-6),
        max_position_embeddings=s.int("max_position_embeddings", 32768),
        rope=read_rope(s, theta, head_dim, multimodal, interleaved),
        qkv_bias=attention_bias,
        qk_norm=not attention_bias,
        **experts,
    )
