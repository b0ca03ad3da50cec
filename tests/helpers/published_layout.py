"""The published checkpoint's tensor layout (names and shapes), written out from the config.

The file format, not our module tree (experts are per-expert tensors here), described apart from
our modules: the oracle that the layout the package derives from its modules is checked against.
"""

from __future__ import annotations

from omniwalk.layers.decoder import DecoderConfig
from omniwalk.models.qwen3_omni.checkpoint.config import (
    AudioEncoderConfig,
    Code2WavConfig,
    Qwen3OmniConfig,
    TalkerConfig,
    VisionEncoderConfig,
)

Layout = dict[str, tuple[int, ...]]


def checkpoint_layout(cfg: Qwen3OmniConfig) -> Layout:
    """Every tensor of a Qwen3-Omni checkpoint: name -> shape ([out, in] for linears)."""
    out: Layout = {}
    out.update(_prefixed("thinker.audio_tower.", _audio(cfg.audio)))
    out.update(_prefixed("thinker.visual.", _vision(cfg.vision)))
    out.update(_prefixed("thinker.model.", _decoder(cfg.text)))
    out["thinker.model.embed_tokens.weight"] = (cfg.text.vocab_size, cfg.text.hidden_size)
    out["thinker.lm_head.weight"] = (cfg.text.vocab_size, cfg.text.hidden_size)
    out.update(_prefixed("talker.", _talker(cfg.talker)))
    out.update(_prefixed("code2wav.", _code2wav(cfg.code2wav)))
    return out


def num_parameters(cfg: Qwen3OmniConfig) -> int:
    total = 0
    for shape in checkpoint_layout(cfg).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def _prefixed(prefix: str, layout: Layout) -> Layout:
    return {prefix + k: v for k, v in layout.items()}


def _linear(name: str, out_dim: int, in_dim: int, bias: bool) -> Layout:
    layout = {f"{name}.weight": (out_dim, in_dim)}
    if bias:
        layout[f"{name}.bias"] = (out_dim,)
    return layout


def _layer_norm(name: str, dim: int) -> Layout:
    return {f"{name}.weight": (dim,), f"{name}.bias": (dim,)}


def _gated_mlp(name: str, hidden: int, inter: int) -> Layout:
    return {
        **_linear(f"{name}.gate_proj", inter, hidden, False),
        **_linear(f"{name}.up_proj", inter, hidden, False),
        **_linear(f"{name}.down_proj", hidden, inter, False),
    }


def _decoder(c: DecoderConfig, qk_norm: bool = True) -> Layout:
    """``layers.N.*`` and ``norm`` of a decoder (thinker LM, talker LM, code predictor)."""
    h, d = c.hidden_size, c.head_dim
    out: Layout = {"norm.weight": (h,)}
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        out.update(_linear(p + "self_attn.q_proj", c.num_attention_heads * d, h, False))
        out.update(_linear(p + "self_attn.k_proj", c.num_key_value_heads * d, h, False))
        out.update(_linear(p + "self_attn.v_proj", c.num_key_value_heads * d, h, False))
        out.update(_linear(p + "self_attn.o_proj", h, c.num_attention_heads * d, False))
        if qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if not c.is_moe:
            out.update(_gated_mlp(p + "mlp", h, c.intermediate_size))
            continue
        out[p + "mlp.gate.weight"] = (c.num_experts, h)
        for e in range(c.num_experts):
            out.update(_gated_mlp(f"{p}mlp.experts.{e}", h, c.moe_intermediate_size))
        if c.shared_expert_intermediate_size:
            out.update(_gated_mlp(p + "mlp.shared_expert", h, c.shared_expert_intermediate_size))
            out[p + "mlp.shared_expert_gate.weight"] = (1, h)
    return out


def _audio(c: AudioEncoderConfig) -> Layout:
    d, ch = c.d_model, c.downsample_hidden_size
    freq = c.num_mel_bins
    for _ in range(3):  # three stride-2 convs over the mel axis
        freq = (freq - 1) // 2 + 1
    out: Layout = {"conv2d1.weight": (ch, 1, 3, 3), "conv2d1.bias": (ch,)}
    for name in ("conv2d2", "conv2d3"):
        out.update({f"{name}.weight": (ch, ch, 3, 3), f"{name}.bias": (ch,)})
    out.update(_linear("conv_out", d, ch * freq, False))
    for i in range(c.encoder_layers):
        p = f"layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out.update(_linear(f"{p}self_attn.{proj}", d, d, True))
        out.update(_layer_norm(p + "self_attn_layer_norm", d))
        out.update(_linear(p + "fc1", c.encoder_ffn_dim, d, True))
        out.update(_linear(p + "fc2", d, c.encoder_ffn_dim, True))
        out.update(_layer_norm(p + "final_layer_norm", d))
    out.update(_layer_norm("ln_post", d))
    out.update(_linear("proj1", d, d, True))
    out.update(_linear("proj2", c.output_dim, d, True))
    return out


def _merger(name: str, c: VisionEncoderConfig, norm_dim: int) -> Layout:
    merged = c.hidden_size * c.spatial_merge_size**2
    return {
        **_layer_norm(f"{name}.ln_q", norm_dim),
        **_linear(f"{name}.mlp.0", merged, merged, True),
        **_linear(f"{name}.mlp.2", c.out_hidden_size, merged, True),
    }


def _vision(c: VisionEncoderConfig) -> Layout:
    h = c.hidden_size
    out: Layout = {
        "patch_embed.proj.weight": (h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size),
        "patch_embed.proj.bias": (h,),
        "pos_embed.weight": (c.num_position_embeddings, h),
    }
    for i in range(c.depth):
        p = f"blocks.{i}."
        out.update(_layer_norm(p + "norm1", h))
        out.update(_layer_norm(p + "norm2", h))
        out.update(_linear(p + "attn.qkv", 3 * h, h, True))
        out.update(_linear(p + "attn.proj", h, h, True))
        out.update(_linear(p + "mlp.linear_fc1", c.intermediate_size, h, True))
        out.update(_linear(p + "mlp.linear_fc2", h, c.intermediate_size, True))
    out.update(_merger("merger", c, h))
    for i in range(len(c.deepstack_visual_indexes)):
        out.update(_merger(f"merger_list.{i}", c, h * c.spatial_merge_size**2))
    return out


def _talker(c: TalkerConfig) -> Layout:
    t, cp = c.text, c.code_predictor
    out: Layout = _prefixed("model.", _decoder(t))
    out["model.codec_embedding.weight"] = (t.vocab_size, t.hidden_size)
    out.update(_linear("codec_head", t.vocab_size, t.hidden_size, False))
    for name in ("text_projection", "hidden_projection"):  # thinker width -> talker width MLPs
        out.update(_linear(f"{name}.linear_fc1", t.intermediate_size, c.thinker_hidden_size, True))
        out.update(_linear(f"{name}.linear_fc2", t.hidden_size, t.intermediate_size, True))
    out.update(_prefixed("code_predictor.model.", _decoder(cp)))
    for g in range(c.num_code_groups - 1):
        out[f"code_predictor.model.codec_embedding.{g}.weight"] = (cp.vocab_size, cp.hidden_size)
        out[f"code_predictor.lm_head.{g}.weight"] = (cp.vocab_size, cp.hidden_size)
    return out


def _code2wav(c: Code2WavConfig) -> Layout:
    h = c.hidden_size
    out: Layout = {"code_embedding.weight": (c.codebook_size * c.num_quantizers, h)}
    for i in range(c.num_hidden_layers):
        p = f"pre_transformer.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            out.update(
                _linear(f"{p}self_attn.{proj}", h if proj == "q_proj" else c.num_key_value_heads * c.head_dim, h, False)
            )
        out.update(_linear(p + "self_attn.o_proj", h, h, False))
        out.update(_gated_mlp(p + "mlp", h, c.intermediate_size))
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn_layer_scale.scale"] = (h,)
        out[p + "mlp_layer_scale.scale"] = (h,)
    out["pre_transformer.norm.weight"] = (h,)
    for u, ratio in enumerate(c.upsampling_ratios):
        p = f"upsample.{u}."
        out.update({p + "0.conv.weight": (h, h, ratio), p + "0.conv.bias": (h,)})
        out.update({p + "1.dwconv.conv.weight": (h, 1, 7), p + "1.dwconv.conv.bias": (h,)})
        out.update(_layer_norm(p + "1.norm", h))
        out.update(_linear(p + "1.pwconv1", 4 * h, h, True))
        out.update(_linear(p + "1.pwconv2", h, 4 * h, True))
        out[p + "1.gamma"] = (h,)
    out.update({"decoder.0.conv.weight": (c.decoder_dim, h, 7), "decoder.0.conv.bias": (c.decoder_dim,)})
    dim = c.decoder_dim
    for b, rate in enumerate(c.upsample_rates, start=1):
        p, half = f"decoder.{b}.block.", dim // 2
        out.update({p + "0.alpha": (dim,), p + "0.beta": (dim,)})
        out.update({p + "1.conv.weight": (dim, half, 2 * rate), p + "1.conv.bias": (half,)})
        for u in (2, 3, 4):  # residual units with dilations 1, 3, 9
            r = f"{p}{u}."
            out.update({r + "act1.alpha": (half,), r + "act1.beta": (half,)})
            out.update({r + "act2.alpha": (half,), r + "act2.beta": (half,)})
            out.update({r + "conv1.conv.weight": (half, half, 7), r + "conv1.conv.bias": (half,)})
            out.update({r + "conv2.conv.weight": (half, half, 1), r + "conv2.conv.bias": (half,)})
        dim = half
    n = len(c.upsample_rates)
    out.update({f"decoder.{n + 1}.alpha": (dim,), f"decoder.{n + 1}.beta": (dim,)})
    out.update({f"decoder.{n + 2}.conv.weight": (1, dim, 7), f"decoder.{n + 2}.conv.bias": (1,)})
    return out
