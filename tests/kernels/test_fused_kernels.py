"""The CUDA fast path's Triton kernels against the PyTorch reference: on the CPU through Triton's
interpreter (fp32: the interpreter lacks some 16-bit constants), and in bf16 on the GPU (``gpu``) at full size.

GPU tolerances: kernels with the reference's rounding steps (norms, rotary, silu·mul) may still differ
by one bf16 step where fp32 reductions run in another order or ``exp`` is approximated; the MoE
sums a token's experts in fp32 where the reference rounds to bf16 after every expert (up to 8
roundings), so it is held to 1% of the output's scale. Each GPU test prints what it measured."""

import copy

import pytest
import torch
from helpers.single_request import ContiguousKVCache
from helpers.triton_cpu import CPU_ONLY, TOL

from omniwalk.kernels import fused_moe, skinny_gemm
from omniwalk.kernels.embed_add import embed_add_triton
from omniwalk.kernels.fused_moe import expert_down, expert_gate_up, expert_gemv
from omniwalk.kernels.moe_routing import route_folded, route_topk, sort_pairs
from omniwalk.kernels.paged_decode import paged_decode_triton
from omniwalk.kernels.qk_norm_rope import qk_norm_rope_triton
from omniwalk.kernels.silu_mul import silu_mul_triton
from omniwalk.layers import moe
from omniwalk.layers.decoder import qk_norm_rope_reference, use_kernels
from omniwalk.layers.kv_attention import paged_decode_reference
from omniwalk.layers.moe import SparseMoE, reference_experts, route, silu_mul_reference
from omniwalk.layers.norm import RMSNorm, residual_add
from omniwalk.layers.rotary import apply_rotary, mrope_cos_sin, rotary_tables
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.common.networks.thinker import Thinker
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import TINY_CONFIG, load_config_dict
from omniwalk.models.qwen3_omni.networks.talker import Talker, embed_add_reference


@CPU_ONLY
@pytest.mark.parametrize("parts", [None, 0, 1, 3])  # None: a plain norm; 0: delta [N, H]; k: partials [N, k, H]
def test_add_rms_norm(interpreter, parts):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 48, generator=g)
    delta = None if parts is None else torch.randn(5, *([parts] if parts else []), 48, generator=g)
    norm = RMSNorm(48, 1e-6)
    norm.weight.data.normal_(1.0, 0.1, generator=g)
    ref = norm.add(h, delta)
    norm.use_fused_kernel()
    ours = norm.add(h, delta)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_expert_parts_add_in_order_with_each_sum_rounded(interpreter, dtype):
    """Parts in h's dtype (the fused MoE's expert outputs, ascending expert id) sum as HF's MoE does:
    ``index_add_`` into zeros, expert by expert, each sum rounded; the kernel equals that bitwise."""
    g = torch.Generator().manual_seed(12)
    h = torch.randn(5, 48, generator=g).to(dtype)
    delta = (torch.randn(5, 8, 48, generator=g) * torch.logspace(-3, 1, 8)[:, None]).to(dtype)
    hf = torch.zeros_like(h)
    for k in range(8):
        hf.index_add_(0, torch.arange(5), delta[:, k])
    assert torch.equal(residual_add(h, delta), h + hf)
    assert not torch.equal(h + hf, h + delta.float().sum(1).to(dtype))  # (the order and steps matter here)
    norm = RMSNorm(48, 1e-6).to(dtype)
    ref = norm.add(h, delta)
    norm.use_fused_kernel()
    for a, b in zip(norm.add(h, delta), ref, strict=True):
        assert torch.equal(a, b)


@CPU_ONLY
@pytest.mark.parametrize("into_store", [False, True])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_adds_the_lora_expand_first(interpreter, into_store, qk_norm):
    """With a LoRA expand left to it (every slot's shrink of each row, the pool's B): what the expand kernel
    and then the rope kernel give; a row without an adapter as without the expand, bitwise."""
    from omniwalk.kernels.lora import expand_lora_triton
    from omniwalk.layers.linear import LoraExpand

    g = torch.Generator().manual_seed(2)
    n, heads, kv_heads, d, slots, rank = 4, 4, 2, 16, 3, 24  # (rank: a merged pool's 3 x 8, padded to 32)
    width = (heads + 2 * kv_heads) * d
    qkv = torch.randn(n, width, generator=g) * 2
    q_w, k_w = (torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5) if qk_norm else (None, None)
    cos, sin = rotary_tables(*mrope_cos_sin(torch.tensor([[5, 6, 7, 8]] * 3), d, 1e6, (2, 3, 3)), torch.float32)
    t = torch.randn(n, slots * rank, generator=g)
    b = torch.randn(slots, width, rank, generator=g) * 0.1
    rows = torch.tensor([2, -1, 0, 1], dtype=torch.int32)
    stores = [(torch.zeros(10, kv_heads, d), torch.zeros(10, kv_heads, d), torch.tensor([7, 2, 5, 1])) for _ in "abc"]
    kv = (lambda i: stores[i]) if into_store else (lambda i: None)
    expanded = qkv.clone()
    expand_lora_triton(expanded, t, b, rows)
    want = qk_norm_rope_triton(expanded, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, kv(0))
    got = qk_norm_rope_triton(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, kv(1), LoraExpand(t, b, rows))
    base = qk_norm_rope_triton(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, kv(2))
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert torch.equal(got[0][1], base[0][1]) and not torch.allclose(got[0][0], base[0][0], **TOL)
    if into_store:
        for a, b_ in zip(stores[0][:2], stores[1][:2], strict=True):
            torch.testing.assert_close(b_, a, **TOL)
        assert torch.equal(stores[1][0][2], stores[2][0][2]) and torch.equal(stores[1][1][2], stores[2][1][2])
    else:
        for i in (1, 2):
            torch.testing.assert_close(got[i], want[i], **TOL)
            assert torch.equal(got[i][1], base[i][1])


@CPU_ONLY
@pytest.mark.parametrize("into_store", [False, True])
@pytest.mark.parametrize("qk_norm", [True, False])  # False: Qwen2-style attention, rope only
def test_qk_norm_rope(interpreter, into_store, qk_norm):
    g = torch.Generator().manual_seed(1)
    n, heads, kv_heads, d = 3, 4, 2, 16
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g) * 2
    q_w, k_w = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    if not qk_norm:
        q_w = k_w = None
    positions = torch.tensor([[5, 6, 7], [5, 9, 2], [5, 1, 3]])
    cos, sin = rotary_tables(*mrope_cos_sin(positions, d, 1e6, (2, 3, 3)), torch.float32)
    stores = [(torch.zeros(10, kv_heads, d), torch.zeros(10, kv_heads, d), torch.tensor([7, 2, 5])) for _ in "ab"]
    kv = (lambda i: stores[i]) if into_store else (lambda i: None)
    ref = qk_norm_rope_reference(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, kv(0))
    ours = qk_norm_rope_triton(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, kv(1))
    torch.testing.assert_close(ours[0], ref[0], **TOL)
    if into_store:
        assert ours[1] is None and ours[2] is None
        for a, b in zip(stores[0][:2], stores[1][:2], strict=True):
            torch.testing.assert_close(a, b, **TOL)
    else:
        torch.testing.assert_close(ours[1], ref[1], **TOL)
        assert torch.equal(ours[2], ref[2])
    # one table row broadcast over every token (the code predictor's passes)
    args = (qkv, q_w, k_w, 1e-6, cos[:1], sin[:1], heads, kv_heads)
    torch.testing.assert_close(qk_norm_rope_triton(*args)[0], qk_norm_rope_reference(*args)[0], **TOL)
    if not qk_norm:  # q is the projection's, roped
        assert torch.equal(ref[0], apply_rotary(qkv.view(n, -1, d)[:, :heads], cos, sin))


@CPU_ONLY
def test_silu_mul(interpreter):
    x = torch.randn(3, 2 * 40, generator=torch.Generator().manual_seed(2)) * 3
    torch.testing.assert_close(silu_mul_triton(x), silu_mul_reference(x), **TOL)


@CPU_ONLY
@pytest.mark.parametrize("renormalize, shared", [(True, 0), (False, 0), (True, 2)])
def test_route_topk(interpreter, renormalize, shared):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 20 + (1 if shared else 0), generator=g)
    weights, ids = route_topk(logits, 4, renormalize, shared)
    ref_w, ref_ids = _by_expert(*route(logits[:, :20], 4, renormalize))
    assert torch.equal(ids[:, :4].long(), ref_ids)
    torch.testing.assert_close(weights[:, :4], ref_w, **TOL)
    if shared:
        assert ids[:, 4:].tolist() == [[20, 21]] * 6
        torch.testing.assert_close(weights[:, 4:], torch.sigmoid(logits[:, 20:]).expand(6, 2), **TOL)
    tied = torch.tensor([[0.0, 2.0, 3.0, 2.0, 3.0, 1.0]])  # equal logits at the k-th: the lower id (like topk)
    assert route_topk(tied, 3, True)[1].tolist() == [[1, 2, 4]]


@CPU_ONLY
@pytest.mark.parametrize("tokens, slots, experts", [(37, 3, 8), (300, 9, 130), (1, 2, 4)])
def test_sort_pairs_equals_a_stable_argsort(interpreter, tokens, slots, experts):
    """The grouped GEMMs' pair order: by expert id, ties in pair order (what a stable sort gives), over
    several of the kernel's 1,024-pair blocks (300 x 9), with experts that get no pair at all."""
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts - 1, (tokens, slots), generator=g, dtype=torch.int32)  # (the last: none)
    weights = torch.rand(tokens, slots, generator=g)
    pairs = sort_pairs(ids, weights, experts)
    order = ids.flatten().long().argsort(stable=True)
    assert torch.equal(pairs.order, order)
    assert torch.equal(pairs.tokens, order // slots)
    assert torch.equal(pairs.weights, weights.flatten()[order])
    assert torch.equal(pairs.ends, torch.bincount(ids.flatten(), minlength=experts).cumsum(0).int())


@CPU_ONLY
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_grouped_moe_backend_equals_reference(interpreter, dtype, tol):
    g = torch.Generator().manual_seed(0)
    n, h, inter, experts, k = 37, 64, 32, 8, 3
    x = torch.randn(n, h, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, h, generator=g) / h**0.5).to(dtype)
    down = (torch.randn(experts, h, inter, generator=g) / inter**0.5).to(dtype)
    weights, ids = route(torch.randn(n, experts, generator=g).to(dtype), k, True)
    ids[0] = torch.tensor([7, 6, 5])  # some experts get no token at all
    expected = reference_experts(x, gate_up, down, weights, ids).float()
    got = fused_moe.grouped_experts(x, gate_up, down, weights, ids).float().sum(1)  # per-pair partials
    assert (got - expected).abs().max() <= tol * expected.abs().max()


def _by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``route``'s (weights, ids) with each token's slots in ascending expert id (the kernels' order)."""
    ids, order = ids.sort(-1)
    return weights.gather(-1, order), ids


@CPU_ONLY
@pytest.mark.parametrize("renormalize, shared", [(True, 0), (False, 0), (True, 3)])
def test_route_folded_equals_route_on_the_router_logits(interpreter, renormalize, shared):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(5, 72, generator=g)  # (72 columns, 20 (+1) rows: off the kernel's blocks)
    router = torch.randn(20 + (1 if shared else 0), 72, generator=g) / 72**0.5
    counters = torch.zeros(8, dtype=torch.int32)
    for _ in range(2):  # the counters are left at zero for the next call
        weights, ids = route_folded(x, router, counters, 4, renormalize, shared, blocks=(4, 1))
        assert counters.tolist() == [0] * 8
    logits = torch.nn.functional.linear(x, router)
    ref_w, ref_ids = _by_expert(*route(logits[:, :20], 4, renormalize))
    assert torch.equal(ids[:, :4].long(), ref_ids)
    torch.testing.assert_close(weights[:, :4], ref_w, **TOL)
    if shared:
        assert ids[:, 4:].tolist() == [[20, 21, 22]] * 5
        torch.testing.assert_close(weights[:, 4:], torch.sigmoid(logits[:, 20:]).expand(5, 3), **TOL)


@CPU_ONLY
def test_expert_gemv(interpreter):
    g = torch.Generator().manual_seed(4)
    n, h, inter, experts = 3, 72, 40, 6  # (sizes off the kernels' blocks: masks)
    x = torch.randn(n, h, generator=g)
    gate_up = torch.randn(experts, 2 * inter, h, generator=g) / h**0.5
    down = torch.randn(experts, h, inter, generator=g) / inter**0.5
    weights, ids = route(torch.randn(n, experts, generator=g), 2, True)
    ref = reference_experts(x, gate_up, down, weights, ids)
    parts = expert_gemv(x, gate_up, down, weights, ids.int())  # (a whole row per step)
    assert parts.shape == (n, 2, h)
    torch.testing.assert_close(parts.sum(1), ref, **TOL)
    ids = ids.int()
    parts = expert_down(expert_gate_up(x, gate_up, ids, (16, 32, 1)), down, weights, ids, (16, 16, 1))  # loops
    torch.testing.assert_close(parts.sum(1), ref, **TOL)


@CPU_ONLY
@pytest.mark.parametrize("programs", [0, 8, 128])  # rows not split; split in 2; up to the splits' cap
def test_paged_decode(interpreter, programs):
    g = torch.Generator().manual_seed(11)
    page, d, num_pages, heads, kv_heads = 4, 16, 60, 4, 2
    keys = torch.randn((num_pages + 1) * page, kv_heads, d, generator=g)
    values = torch.randn(keys.shape, generator=g)
    lens = [1, 3, 4, 5, 17, 40, 0]  # 0: a padding row
    table = torch.zeros(len(lens), 12, dtype=torch.int32)
    pages = torch.randperm(num_pages, generator=g).tolist()
    for row, n in enumerate(lens):
        table[row, : -(-n // page)] = torch.tensor(pages[: -(-n // page)], dtype=torch.int32)
        pages = pages[-(-n // page) :]
    lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, d, generator=g)
    semaphores = torch.zeros(64, dtype=torch.int32) if programs else None
    ours = paged_decode_triton(q, keys, values, table, lens, page, semaphores, blocks=(8, 1), programs=programs)
    torch.testing.assert_close(ours, paged_decode_reference(q, keys, values, table, lens, page), **TOL)
    assert not programs or semaphores.abs().sum() == 0  # left zero for the next call
    assert torch.equal(ours[-1], torch.zeros_like(ours[-1]))


@CPU_ONLY
@pytest.mark.parametrize("max_gemv_pairs", [64, 0])  # expert GEMVs, or the grouped GEMM beyond them
def test_fused_moe_with_its_shared_expert_folded_in(interpreter, monkeypatch, max_gemv_pairs):
    monkeypatch.setattr(moe, "MAX_GEMV_PAIRS", max_gemv_pairs)
    ref = SparseMoE(32, 8, 2, 16, True, shared_intermediate_size=48)
    randomize(ref, 5)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    assert fused.experts.gate_up_proj.shape[0] == 8 + 3 and fused.shared_expert is None
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(6))
    out = fused(x)
    torch.testing.assert_close(out.sum(1) if out.dim() == 3 else out, ref(x), **TOL)


def _pair(cls, *args):
    """(reference module, the same weights on the fused path) from the tiny config."""
    ref = cls(*args, "reference").eval()
    randomize(ref, 7)
    fused = cls(*args, "fused").eval()
    fused.load_state_dict(ref.state_dict())
    use_kernels(fused, "fused")
    return ref, fused


@CPU_ONLY
@torch.no_grad()
def test_fused_thinker_equals_reference_with_talker_states(interpreter):
    cfg = Qwen3OmniConfig.from_hf(load_config_dict(TINY_CONFIG))
    ref, fused = _pair(Thinker, cfg.text, cfg.tokens, cfg.talker.accept_hidden_layer)
    assert not hasattr(fused.model.layers[0].self_attn, "q_proj")  # merged into qkv_proj
    ids = torch.randint(0, 100, (7,), generator=torch.Generator().manual_seed(8))
    outs = []
    for model in (ref, fused):
        kv = ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu")
        prompt = model(ids, torch.arange(7), kv, all_logits=True, talker_states=True)
        step = model(ids[:1], torch.tensor([7]), kv)  # one decode token after the prompt
        outs.append((prompt.logits, prompt.accept_hidden, step.logits))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("rows", [7, 1])  # a prompt (the kernel's tl.dot tiles); a decode row (the GEMV, norm folded)
def test_fused_qwen2_style_thinker_and_talker_equal_reference(interpreter, monkeypatch, rows):
    """Qwen2.5-Omni's dense decoders (biased q/k/v, no q/k norm) on the fast path: q/k/v merged with their
    biases into one GEMM (at one row, the input norm folded in), then the rope-only kernel storing K/V."""
    from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig as Config
    from omniwalk.models.qwen2_5_omni.checkpoint.tiny import load_config_dict as qwen2_5_config
    from omniwalk.models.qwen2_5_omni.networks.talker import Talker as Qwen25Talker

    cfg = Config.from_hf(qwen2_5_config(None))
    folds = []
    fold = skinny_gemm.normed_skinny_gemm
    monkeypatch.setattr(skinny_gemm, "normed_skinny_gemm", lambda *a, **k: folds.append(1) or fold(*a, **k))
    for name, build, decoder_cfg in [
        ("thinker", lambda: Thinker(cfg.text, cfg.tokens, cfg.text.num_hidden_layers, deepstack=False), cfg.text),
        ("talker", lambda: Qwen25Talker(cfg.talker), cfg.talker.text),
    ]:
        ref = build().eval()
        randomize(ref, 7)
        fused = build().eval()
        fused.load_state_dict(ref.state_dict())
        use_kernels(fused, "fused")
        attention = fused.model.layers[0].self_attn
        assert attention.qkv_proj.bias is not None and not hasattr(attention, "q_proj"), name
        x = torch.randn(rows, decoder_cfg.hidden_size, generator=torch.Generator().manual_seed(9))
        outs = []
        for m in (ref, fused):
            kv = ContiguousKVCache.for_config(decoder_cfg, torch.float32, "cpu")
            outs.append(m.model(x, torch.arange(rows), kv))  # (the decoder: rows in, final-normed rows out)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    assert bool(folds) == (rows == 1)


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize("rows", [3, 1])  # 1: the code predictor's norms folded into its GEMVs (and heads)
def test_fused_talker_and_code_predictor_equal_reference(interpreter, monkeypatch, rows):
    cfg = Qwen3OmniConfig.from_hf(load_config_dict(TINY_CONFIG))
    ref, fused = _pair(Talker, cfg.talker)
    folds = []
    fold = skinny_gemm.normed_skinny_gemm
    monkeypatch.setattr(skinny_gemm, "normed_skinny_gemm", lambda *a, **k: folds.append(1) or fold(*a, **k))
    x = torch.randn(rows, cfg.talker.text.hidden_size, generator=torch.Generator().manual_seed(9))
    outs = []
    for model in (ref, fused):
        kv = ContiguousKVCache.for_config(cfg.talker.text, torch.float32, "cpu")
        hidden = model.model(x, torch.arange(rows), kv)
        codes, total = model.code_predictor(hidden, hidden.flip(0), lambda logits, i: logits.argmax(-1))
        outs.append((hidden, codes, total))
    groups, layers = cfg.talker.num_code_groups, cfg.talker.code_predictor.num_hidden_layers
    # one row: the talker's first norm (no delta) and, in each one-token pass, every layer's two and the final one
    assert len(folds) == (1 + (groups - 2) * (2 * layers + 1) if rows == 1 else 0)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[1][1], outs[0][1])
    torch.testing.assert_close(outs[1][2], outs[0][2], rtol=1e-4, atol=1e-4)


@CPU_ONLY
def test_fused_kernels_through_the_engine_give_the_same_ids_and_codes(interpreter):
    """A speech request on the tiny checkpoint: paged decode steps store keys from the fused kernel,
    the code predictor attends through the paged decode kernel; ids and codes equal the reference's."""
    from helpers.qwen3_omni import checkpoint, greedy

    from omniwalk import Omni

    request = greedy(6) | dict(modalities=["text", "audio"], min_audio_frames=4, max_audio_frames=4)
    request |= dict(talker_temperature=0.0, code_predictor_temperature=0.0)
    outs = [
        Omni(model=checkpoint("tiny"), moe_backend=moe, decoder_kernels=norm).generate(request)
        for moe, norm in (("reference", "reference"), ("fused", "fused"))
    ]
    assert outs[1].token_ids == outs[0].token_ids
    assert torch.equal(outs[1].codes, outs[0].codes)


@CPU_ONLY
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fused_kernels_through_the_engine_on_qwen2_5_omni(interpreter):
    """Qwen2.5-Omni's speech walk on its tiny checkpoint with the fast path's kernels (biased merged q/k/v,
    rope-only kernel storing K/V, folded norms, skinny GEMVs) in the thinker and the talker: ids, codes and
    audio as on the reference path."""
    from helpers.qwen2_5_omni import checkpoint, make_request

    from omniwalk import Omni

    request = make_request(3) | dict(max_tokens=6, min_audio_frames=8, max_audio_frames=8)  # audio in, speech out
    omnis = [Omni(model=checkpoint("tiny"), decoder_kernels=norm) for norm in ("reference", "fused")]
    outs = [o.generate(request) for o in omnis]
    fused = omnis[1].engine.stages["thinker"].program.thinker
    assert fused.model.layers[0].self_attn.qkv_proj.bias is not None  # (the fast path ran)
    assert outs[1].token_ids == outs[0].token_ids and outs[1].codes == outs[0].codes and len(outs[0].codes) > 3
    torch.testing.assert_close(outs[1].audio, outs[0].audio, rtol=0, atol=1e-4)


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_add(interpreter, dtype):
    g = torch.Generator().manual_seed(10)
    table, total = torch.randn(50, 40, generator=g).to(dtype), torch.randn(3, 40, generator=g).to(dtype)
    ids = torch.tensor([7, 0, 49])
    ours, ref = embed_add_triton(table, ids, total), embed_add_reference(table, ids, total)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


BF16 = torch.bfloat16


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a != b).float().mean().item()


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [None, 0, 8])
def test_add_rms_norm_bf16(parts):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(32, 2048, generator=g, device="cuda").to(BF16)
    delta = None if parts is None else torch.randn(32, *([parts] if parts else []), 2048, generator=g, device="cuda")
    delta = delta if delta is None else delta.to(BF16)
    norm = RMSNorm(2048).to("cuda", BF16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    ref = norm.add(h, delta)
    norm.use_fused_kernel()
    ours = norm.add(h, delta)
    differ = f"h {_differ(ours[0], ref[0]):.4%} out {_differ(ours[1], ref[1]):.4%}"
    print(f"GPU-FUSED add+norm parts={parts}: elements that differ: {differ}")
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=8e-3, atol=8e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 32])
def test_qk_norm_rope_into_paged_store(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    heads, kv_heads, d = 32, 4, 128
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g, device="cuda").to(BF16)
    q_w, k_w = (1 + 0.1 * torch.randn(2, d, generator=g, device="cuda")).to(BF16)
    positions = torch.randint(0, 4000, (3, n), generator=g, device="cuda")
    cos, sin = rotary_tables(*mrope_cos_sin(positions, d, 1e6, (24, 20, 20)), BF16)
    slots = torch.randperm(1000, device="cuda")[:n]
    stores = [tuple(torch.zeros(1000, kv_heads, d, device="cuda", dtype=BF16) for _ in "kv") + (slots,) for _ in "ab"]
    q_ref = qk_norm_rope_reference(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, stores[0])[0]
    q = qk_norm_rope_triton(qkv, q_w, k_w, 1e-6, cos, sin, heads, kv_heads, stores[1])[0]
    print(
        f"GPU-FUSED q/k norm + rope + store n={n}: differ q {_differ(q, q_ref):.4%} "
        f"k {_differ(stores[1][0], stores[0][0]):.4%} v {_differ(stores[1][1], stores[0][1]):.4%}"
    )
    ones, zeros = torch.ones_like(cos), torch.zeros_like(sin)  # no rotation: the norm alone
    norm_only = [
        f(qkv, q_w, k_w, 1e-6, ones, zeros, heads, kv_heads)[0] for f in (qk_norm_rope_reference, qk_norm_rope_triton)
    ]
    print(f"GPU-FUSED q/k norm alone n={n}: differ q {_differ(*norm_only):.4%}")
    # bitwise: the kernel rounds where the reference rounds and compiles without FP contraction
    # (with it, ~20% of q/k elements were a bf16 step off: the rotary product fused into the add)
    assert torch.equal(q, q_ref)
    assert torch.equal(stores[1][0], stores[0][0])
    assert torch.equal(stores[1][1], stores[0][1])  # v is copied


@pytest.mark.gpu
def test_silu_mul_bf16():
    x = torch.randn(32, 2 * 3072, device="cuda").to(BF16) * 3
    ours, ref = silu_mul_triton(x), silu_mul_reference(x)
    print(f"GPU-FUSED silu·mul: differ {_differ(ours, ref):.4%}")
    torch.testing.assert_close(ours, ref, rtol=8e-3, atol=8e-3)


@pytest.mark.gpu
def test_route_topk_bf16():
    logits = torch.randn(64, 128, device="cuda").to(BF16)
    weights, ids = route_topk(logits, 8, True)
    ref_w, ref_ids = route(logits, 8, True)
    rows = (ids.long().sort(-1).values == ref_ids.sort(-1).values).all(-1)
    print(f"GPU-FUSED routing: same expert set for {rows.float().mean():.2%} of tokens (bf16 logits may tie)")
    assert rows.float().mean() >= 0.95
    torch.testing.assert_close(weights[rows].sort(-1).values, ref_w[rows].sort(-1).values, rtol=1e-2, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, slots, experts", [(32, 8, 128), (1024, 8, 130), (1024, 10, 258)])
def test_sort_pairs(tokens, slots, experts):
    """The grouped GEMMs' pair order equals a stable sort's, at decode and prefill sizes (many blocks)."""
    g = torch.Generator(device="cuda").manual_seed(tokens + slots)
    ids = torch.randint(0, experts - 2, (tokens, slots), generator=g, device="cuda", dtype=torch.int32)
    weights = torch.rand(tokens, slots, generator=g, device="cuda").to(BF16)
    pairs = sort_pairs(ids, weights, experts)
    order = ids.flatten().long().argsort(stable=True)
    assert torch.equal(pairs.order, order) and torch.equal(pairs.tokens, order // slots)
    assert torch.equal(pairs.weights, weights.flatten()[order])
    assert torch.equal(pairs.ends, torch.bincount(ids.flatten(), minlength=experts).cumsum(0).int())


@pytest.mark.gpu
@pytest.mark.parametrize("name, hidden, top_k, shared", [("thinker", 2048, 8, 0), ("talker", 1024, 6, 2)])
@pytest.mark.parametrize("tokens", [1, 16])
def test_route_folded(name, hidden, top_k, shared, tokens):
    """Against ``route`` on cuBLAS's bf16 router logits: the logits may differ by a bf16 step where
    the fp32 sums run in another order, which flips a choice only at a near-tie."""
    g = torch.Generator(device="cuda").manual_seed(5)
    tokens_x = torch.randn(64 * tokens, hidden, generator=g, device="cuda").to(BF16)
    router = (torch.randn(128 + (1 if shared else 0), hidden, generator=g, device="cuda") * hidden**-0.5).to(BF16)
    counters = torch.zeros(16, dtype=torch.int32, device="cuda")
    got = [route_folded(x, router, counters, top_k, True, shared) for x in tokens_x.split(tokens)]
    weights, ids = (torch.cat(t) for t in zip(*got, strict=True))
    logits = torch.nn.functional.linear(tokens_x, router)
    ref_w, ref_ids = route(logits[:, :128], top_k, True)
    rows = (ids[:, :top_k].long().sort(-1).values == ref_ids.sort(-1).values).all(-1)
    print(
        f"GPU-FUSED folded router {name} tokens={tokens}: same expert set for {rows.float().mean():.2%} of "
        f"{rows.numel()} tokens; counters left {counters.abs().sum().item()}"
    )
    assert rows.float().mean() >= 0.95 and counters.abs().sum().item() == 0
    torch.testing.assert_close(weights[rows, :top_k].sort(-1).values, ref_w[rows].sort(-1).values, rtol=1e-2, atol=1e-3)
    if shared:
        assert (ids[:, top_k:] == torch.arange(128, 128 + shared, device="cuda")).all()
        torch.testing.assert_close(weights[:, top_k:], torch.sigmoid(logits[:, 128:]).expand(-1, shared))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, hidden, experts, top_k, inter, shared",
    [("thinker", 2048, 128, 8, 768, 0), ("talker", 1024, 128, 6, 384, 768)],
)
@pytest.mark.parametrize("tokens", [1, 8, 32, 1024])  # 32, 1024 (a prefill chunk): past MAX_GEMV_PAIRS, grouped
@torch.inference_mode()
def test_fused_moe_matches_reference(name, hidden, experts, top_k, inter, shared, tokens):
    torch.manual_seed(tokens)  # (the input below: the same on every run)
    with torch.device("cuda"):
        ref = SparseMoE(hidden, experts, top_k, inter, True, shared).to(BF16)
    randomize(ref, 3)
    fused = copy.deepcopy(ref)
    fused.backend = "fused"
    fused.fold_shared_expert()
    x = torch.randn(tokens, hidden, device="cuda").to(BF16)
    out = fused(x)
    out = residual_add(torch.zeros_like(x), out)  # (the pairs summed as the decoder's next add + norm sums them)
    expected = ref(x)
    err = ((out.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    path = "GEMV" if tokens * (top_k + fused.num_shared) <= moe.MAX_GEMV_PAIRS else "grouped"
    print(
        f"GPU-FUSED MoE {name} tokens={tokens} ({path}): max error {err:.2e} of the output's max, "
        f"elements that differ {_differ(out, expected):.4%}"
    )
    # both sides round expert outputs and their weighted sums to bf16 (2^-8 relative), in different orders: a few
    # roundings at the output's largest element
    assert err < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 32])
def test_embed_add_bf16(rows):
    """The code predictor's embedding + running sum: a copy and one rounded add, bitwise the reference."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    table = torch.randn(2048, 1024, generator=g, device="cuda").to(BF16)
    total = torch.randn(rows, 1024, generator=g, device="cuda").to(BF16)
    ids = torch.randint(0, 2048, (rows,), generator=g, device="cuda")
    ours, ref = embed_add_triton(table, ids, total), embed_add_reference(table, ids, total)
    print(f"GPU-FUSED embed_add rows={rows}: differ {_differ(ours[0], ref[0]):.4%} / {_differ(ours[1], ref[1]):.4%}")
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
