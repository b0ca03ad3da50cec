"""The Triton kernels of the fast paths, one module per kernel: the ``@triton.jit`` function at module
level beside its launcher (which checks shapes and picks the launch configuration), as nano-vllm
places them.

    add_rms_norm   residual add + RMSNorm                  skinny_gemm   decode-sized GEMMs (+ folded norm)
    silu_mul       silu(gate) * up                         qk_norm_rope  q/k norm + rope (+ KV store)
    paged_decode   decode attention over paged KV          head_rope     rope of head 0 (the DiT)
    fused_moe      the fused MoE: expert GEMVs, grouped    adaln         AdaLN-zero (the DiT)
    moe_routing    routing and expert-sorted pairs         embed_add     embedding + running sum
    grouped_fp8    FP8 grouped expert GEMM                 sampling      fused draws
    fp8            e4m3 widening, dequantize               pdl           programmatic dependent launch

These modules import Triton; nothing imports them until a fast path runs (the package itself, and
``registry``, ``tuned`` and ``pdl``, import without Triton or CUDA). Which implementation runs is
chosen once, by name, from the config (``registry.py``); tuned launch configurations are data,
keyed by shape and GPU model (``tuned.py``, ``configs/*.json``). The PyTorch references the kernels
are tested against live beside the modules that use them (``omniwalk/layers/``, the models).
"""
