"""The decoder's LoRA paths against each other (small random layers, the CPU; Triton kernels through its
interpreter): the fused path's merged q/k/v and gate/up projections with the pool's merged adapter slots add
what the reference path's separate projections with per-module slots add; rows of the base are untouched."""

import copy

import torch
from helpers.triton_cpu import CPU_ONLY
from torch import nn

from omniwalk.layers import linear
from omniwalk.layers.decoder import Decoder, DecoderConfig, RopeConfig, RowsKVCache, use_fused_kernels
from omniwalk.layers.linear import LoraRows
from omniwalk.lora.adapters import Adapter, thinker_targets
from omniwalk.lora.pool import MERGED, AdapterPool

CFG = DecoderConfig(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_position_embeddings=64,
    rope=RopeConfig(theta=10000.0),
)
# one-token sequences of adapters 0, 1 and the base; more rows than the skinny GEMM takes (it needs a GPU)
SLOTS = torch.tensor([0, -1, 1, 0, -1] * 8, dtype=torch.int32)
N = len(SLOTS)


def random_adapter(name: str, rank: int, seed: int) -> Adapter:
    g = torch.Generator().manual_seed(seed)
    weights = {
        key: (torch.randn(rank, t.in_features, generator=g) * 0.1, torch.randn(t.out_features, rank, generator=g) * 0.1)
        for key, t in thinker_targets(CFG).items()
    }
    return Adapter(name=name, path="", rank=rank, weights=weights)


def pool(merged) -> AdapterPool:
    p = AdapterPool(thinker_targets(CFG), 2, 8, "cpu", torch.float32, merged=merged)
    for adapter in (random_adapter("x", 8, 1), random_adapter("y", 4, 2)):
        p.register(adapter)
        p.acquire(adapter.name)
    return p


def forward(decoder: Decoder, lora: LoraRows | None, n: int = N) -> torch.Tensor:
    """The decoder on the first ``n`` of the ``N`` one-token rows."""
    x = torch.randn(N, CFG.hidden_size, generator=torch.Generator().manual_seed(3))[:n]
    cache = RowsKVCache(n, CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim, torch.float32, "cpu", 4)
    return decoder(x, torch.zeros(n, dtype=torch.long), cache, lora=lora)


def decoders() -> tuple[Decoder, Decoder]:
    """A small random decoder, and its copy on the fused path (merged projections, skinny GEMMs)."""
    torch.manual_seed(0)
    reference = Decoder(CFG).eval()
    for p in reference.parameters():
        nn.init.normal_(p, std=0.05)
    fused = copy.deepcopy(reference)
    use_fused_kernels(fused)
    return reference, fused


@torch.inference_mode()
def test_merged_projections_with_merged_slots_equal_separate_ones():
    reference, fused = decoders()
    assert fused.layers[0].self_attn.qkv_proj is not None and fused.layers[0].mlp.gate_up_proj is not None
    separate, merged = pool(None), pool(MERGED)
    assert (0, "qkv_proj") in merged.a and (0, "q_proj") in separate.a
    want = forward(reference, LoraRows(SLOTS, separate.a, separate.b))
    got = forward(fused, LoraRows(SLOTS, merged.a, merged.b))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    base = forward(reference, None)
    assert torch.equal(want[SLOTS < 0], base[SLOTS < 0])  # base rows bit for bit
    assert (want[SLOTS >= 0] - base[SLOTS >= 0]).abs().amin(dim=-1).gt(0).all()  # adapted rows changed


@CPU_ONLY
@torch.inference_mode()
def test_shrink_folded_into_the_skinny_gemm_adds_what_the_reference_adds(interpreter, monkeypatch):
    """Decode-sized batches (<= the skinny GEMM's rows) with the Triton LoRA backend: the pool's A rows run in
    the q/k/v, o and down GEMVs (no shrink kernel; q/k/v's expand inside the rope kernel, an expand kernel after
    o and down) and add what the reference adds."""
    import omniwalk.kernels.lora as lora_kernels

    reference, fused = decoders()
    expands, shrinks = [], []
    monkeypatch.setattr(lora_kernels, "expand_lora_triton", _counting(lora_kernels.expand_lora_triton, expands))
    shrink = _counting_grid(lora_kernels.lora_shrink_row_kernel, shrinks)
    monkeypatch.setattr(lora_kernels, "lora_shrink_row_kernel", shrink)
    separate, merged = pool(None), pool(MERGED)
    slots = SLOTS[:5]

    def run(decoder, lora):
        return forward(decoder, lora, n=len(slots))

    want = run(reference, LoraRows(slots, separate.a, separate.b))
    apart = run(fused, LoraRows(slots, merged.a, merged.b, backend="triton"))
    assert not expands  # (this tiny pool's A rows are too many beside the projections' for the default share)
    monkeypatch.setattr(linear, "FOLDED_SHRINK_SHARE", 1.0)
    shrinks.clear()
    got = run(fused, LoraRows(slots, merged.a, merged.b, backend="triton"))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(apart, want, atol=2e-5, rtol=1e-4)
    # q/k/v (its expand in the rope kernel), o and down folded (an expand kernel each), no shrink kernel; the
    # dense MLP's gate/up (gated) apart
    assert len(expands) == 2 * CFG.num_hidden_layers and len(shrinks) == CFG.num_hidden_layers
    base = run(fused, None)
    assert torch.equal(got[slots < 0], base[slots < 0])  # (the extra rows leave the projections' own as they were)


def _counting(fn, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return counted


def _counting_grid(kernel, calls):
    class Grid:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    return Grid()
