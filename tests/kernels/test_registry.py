"""The fast paths are chosen by one mechanism: a registry per op (``omniwalk/kernels/registry.py``).

Every fast-path knob of ``ModelConfig`` names exactly one registry and every registry one knob; each
registry starts with its reference, which runs on the CPU; "auto" resolves by device and dtype; every
entry's implementation can be loaded (the Triton ones through the interpreter here)."""

import dataclasses
import importlib.util

import pytest
import torch

from omniwalk.config import ModelConfig, backend_choices
from omniwalk.errors import ConfigError
from omniwalk.kernels import registry
from omniwalk.kernels.registry import (
    ATTENTION,
    DECODE_ATTENTION,
    DECODER_KERNELS,
    LORA,
    MOE,
    PERSISTENT_DECODE,
    REGISTRIES,
)

ALL = (ATTENTION, DECODE_ATTENTION, MOE, DECODER_KERNELS, LORA, PERSISTENT_DECODE)
TRITON = importlib.util.find_spec("triton") is not None


def test_every_fast_path_knob_is_one_registry():
    knobs = [r.knob for r in ALL]
    assert len(set(knobs)) == len(knobs) == len(REGISTRIES)  # one knob per registry, none shared
    assert set(REGISTRIES) == set(knobs)
    assert {v for v in vars(registry).values() if isinstance(v, registry.Registry)} == set(ALL)  # none unlisted
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    auto = {name for name, f in fields.items() if f.default == registry.AUTO}
    assert auto == set(REGISTRIES)  # every field the device decides is a registry's knob, and only those
    assert backend_choices() == {knob: r.choices() for knob, r in REGISTRIES.items()}  # the CLI's choices
    assert "norm_backend" not in fields  # (renamed: the knob also merges projections)


@pytest.mark.parametrize("r", ALL, ids=lambda r: r.knob)
def test_the_reference_comes_first_runs_everywhere_and_ends_auto(r):
    reference = next(iter(r.entries.values()))
    assert reference.name == r.reference == "reference" and r.prefer[-1] == "reference"
    assert reference.runs("cpu", "float32") and not reference.cuda and not reference.half
    assert r.resolve("auto", "cpu", "float32") == "reference"
    assert r.resolve("auto", "cpu", "bfloat16") == "reference"  # (every fast entry needs CUDA)
    assert all(not impl.runs("cpu", "bfloat16") for name, impl in r.entries.items() if name in r.prefer[:-1])


@pytest.mark.parametrize("r", ALL, ids=lambda r: r.knob)
def test_auto_on_cuda_takes_the_fast_entry_where_it_runs(r):
    fast = r.resolve("auto", "cuda:1", "bfloat16")
    needs_triton = r.entries[r.prefer[0]].package == "triton"
    assert fast == (r.prefer[0] if TRITON or not needs_triton else "reference")
    assert r.resolve("reference", "cuda", "bfloat16") == "reference"  # a name is kept as given
    with pytest.raises(ConfigError, match=r.knob):
        r.resolve("flash", "cuda", "bfloat16")


def test_attention_needs_a_half_dtype_and_masked_is_by_name_only():
    assert ATTENTION.resolve("auto", "cuda", "float32") == "reference"
    assert ATTENTION.resolve("auto", "cuda", "float16") == "torch_varlen"
    assert "masked" in ATTENTION.choices() and "masked" not in ATTENTION.prefer


@pytest.mark.parametrize("r", ALL, ids=lambda r: r.knob)
def test_every_entry_loads(r):
    for name in r.names():
        if r.entries[name].package and importlib.util.find_spec(r.entries[name].package) is None:
            continue
        assert callable(r.load(name)) or hasattr(r.load(name), "forward"), name


def test_config_rejects_an_unknown_entry_naming_the_knob():
    with pytest.raises(ConfigError, match="decoder_kernels"):
        ModelConfig(model="m", decoder_kernels="triton")


# The reference entries run on the CPU: each against an independent computation.


def test_reference_attention_entries_agree_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 4, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    outs = [ATTENTION.load(name)(q, k, v, cu, cu, 4, 4, True, 8**-0.5) for name in ("reference", "masked")]
    first = torch.nn.functional.scaled_dot_product_attention(
        q[:3].transpose(0, 1), k[:3].transpose(0, 1), v[:3].transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    torch.testing.assert_close(outs[0][:3], first)
    torch.testing.assert_close(outs[1], outs[0])


def test_reference_decode_attention_reads_the_pages_on_the_cpu():
    g = torch.Generator().manual_seed(1)
    page, heads, kv_heads, d = 4, 4, 2, 8
    keys, values = torch.randn(24, kv_heads, d, generator=g), torch.randn(24, kv_heads, d, generator=g)
    table = torch.tensor([[5, 1], [2, 0]], dtype=torch.int32)  # row 0: pages 5, 1; row 1: page 2
    lens = torch.tensor([6, 3], dtype=torch.int32)
    q = torch.randn(2, heads, d, generator=g)
    out = DECODE_ATTENTION.load("reference")(q, keys, values, table, lens, page)
    slots = torch.tensor([20, 21, 22, 23, 4, 5])  # row 0's 6 keys: page 5's four, page 1's first two
    k, v = keys[slots].repeat_interleave(2, 1), values[slots].repeat_interleave(2, 1)  # (GQA: 2 heads a group)
    weights = torch.softmax(torch.einsum("hd,khd->hk", q[0], k) * d**-0.5, -1)
    torch.testing.assert_close(out[0], torch.einsum("hk,khd->hd", weights, v))


def test_reference_moe_and_decoder_kernels_run_on_the_cpu():
    from omniwalk.layers.decoder import Decoder, DecoderConfig, RopeConfig, use_kernels
    from omniwalk.layers.moe import ReferenceMoE, SparseMoE

    cfg = DecoderConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=0,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope=RopeConfig(theta=10000.0),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
    )
    decoder = Decoder(cfg, "reference")
    for p in decoder.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2, generator=torch.Generator().manual_seed(2))
    moe = decoder.layers[0].mlp
    assert isinstance(moe, SparseMoE) and isinstance(moe.impl, ReferenceMoE)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    before = moe(x)
    use_kernels(decoder, "reference")  # the reference entry changes nothing
    assert torch.equal(moe(x), before) and decoder.layers[0].self_attn.qkv_proj is None
    assert decoder.norm.kernel is None and moe.shared_expert is not None
