"""CUDA fast path on the GPU machine: the Triton paged-decode kernel against the reference, and
CUDA-graph replay against eager execution of the same step (thinker decode, talker frame step).

Prefill graphs (``engine/prefill_graphs.py``) on the CPU: the padded layout, and the programs'
graph path run eagerly over it (a stand-in replaces the CUDA capture), equal to the eager path."""

import pytest
import torch
from helpers.qwen3_omni import (
    PATHS,
    alone,
    assert_same,
    checkpoint,
    gpu_omni,
    gpu_requests,
    make_request,
    run_staggered,
)
from helpers.replay import EagerReplay

from omniwalk import Omni
from omniwalk.engine import prefill_graphs
from omniwalk.engine.kv_pages import KVStorage, PagePool, PageTable
from omniwalk.engine.packed_graphs import Bucket
from omniwalk.engine.paged_attention import DecodeKV, PagedBatch, Segment
from omniwalk.engine.prefill_graphs import PrefillKV, PrefillPlan, fits, kv_inputs
from omniwalk.kernels.paged_decode import DECODE_BLOCKS, num_splits, paged_decode_triton
from omniwalk.layers.kv_attention import paged_decode_reference
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig


@pytest.mark.gpu
@pytest.mark.parametrize("heads,kv_heads", [(32, 4), (16, 2), (16, 8), (4, 4)])
@pytest.mark.parametrize("lens", [[1, 15, 16, 17, 64, 65, 300, 1000, 0], [207], [17, 130, 512, 2000]])
@pytest.mark.parametrize("split", [False, True])  # rows split over programs (semaphores given) or not
def test_triton_paged_decode_matches_reference(heads, kv_heads, lens, split):
    torch.manual_seed(0)
    page, d, num_pages = 16, 128, 400
    keys = torch.randn((num_pages + 1) * page, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    perm = torch.randperm(num_pages).tolist()
    table = torch.zeros(len(lens), 130, dtype=torch.int32)
    used = 0
    for row, n in enumerate(lens):
        k = -(-n // page)
        table[row, :k] = torch.tensor(perm[used : used + k])
        used += k
    table, lens_t = table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), heads, d, device="cuda", dtype=torch.bfloat16)
    semaphores = torch.zeros(128, dtype=torch.int32, device="cuda") if split else None
    ours = paged_decode_triton(q, keys, values, table, lens_t, page, semaphores)
    ref = paged_decode_reference(q, keys, values, table, lens_t, page)
    err = (ours.float() - ref.float()).abs().max().item()
    splits = num_splits(len(lens) * kv_heads, table.shape[1] * page, DECODE_BLOCKS[0]) if split else 1
    print(
        f"GPU-PARITY paged decode triton vs reference heads={heads}/{kv_heads} rows={len(lens)} "
        f"max_len={max(lens)} splits={splits}: max abs {err:.2e}"
    )
    assert err < 2e-2
    if split:
        assert torch.equal(semaphores, torch.zeros_like(semaphores))  # left zero for the next call
    if lens[-1] == 0:
        assert torch.equal(ours[-1], torch.zeros_like(ours[-1]))  # the padding row reads nothing


@pytest.mark.gpu
def test_graph_replay_equals_eager_through_the_engine():
    """Same requests, graphs on and off: identical ids, codes and audio, except where bf16 GEMMs
    chosen differently under capture break a near tie (then the eager top-2 gap must be tiny).
    Prefill graphs (padded layouts: other GEMM shapes) are tested on their own below."""
    eager, graphed = gpu_omni(0), gpu_omni(8, prefill_graph_max_tokens=0)
    a, b = eager.generate(gpu_requests()), graphed.generate(gpu_requests())
    stats = graphed.engine.stats()
    print(f"GPU-GRAPHS stats thinker={stats['thinker']} talker={stats['talker']}")
    print(f"GPU-GRAPHS stats vocoder={stats['vocoder']}")
    assert stats["thinker"]["graph_replays"] > 0 and stats["talker"]["graph_replays"] > 0
    assert stats["vocoder"]["graph_replays"] >= 3 and stats["vocoder"]["eager_calls"] == 0
    assert eager.engine.stats()["thinker"]["graph_replays"] == 0
    same = 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.error is None and y.error is None
        if x.token_ids != y.token_ids:
            k = next(j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=True)) if s != t)
            top = x.logprobs[k].top
            gap = top[0][1] - top[1][1]
            print(f"GPU-GRAPHS request {i}: ids differ first at {k}; eager top-2 logprob gap {gap:.4f}")
            assert gap < 0.05 or x.logprobs[k].token_id != top[0][0]  # a near tie (or a sampled row)
            continue
        same += 1
        logprob_err = max(abs(p.logprob - q.logprob) for p, q in zip(x.logprobs, y.logprobs, strict=True))
        print(f"GPU-GRAPHS request {i}: ids equal, max logprob difference {logprob_err:.2e}")
        if x.codes is not None:
            equal = torch.equal(x.codes, y.codes)
            audio_err = (x.audio - y.audio).abs().max().item()
            print(f"GPU-GRAPHS request {i}: codes equal {equal}, audio max abs difference {audio_err:.2e}")
            assert equal and torch.equal(x.audio, y.audio)
    assert same >= 6


@pytest.mark.gpu
@torch.inference_mode()
@pytest.mark.parametrize("live", [3, 4])
def test_padding_rows_do_not_touch_real_rows(live):
    """Three live rows replayed in the 4-row graph equal eager over the same 4 rows (the 4th a
    padding row) exactly, and eager over 3 rows closely; the padding row writes only the scratch slot.
    The replay from host inputs (packed upload, a narrower table) equals the one from device tensors."""
    omni = gpu_omni(4)
    program = omni.engine.stages["thinker"].program
    storage: KVStorage = omni.engine.stages["thinker"].storage
    pool: PagePool = storage.pool
    for k, v in zip(storage.keys, storage.values, strict=True):
        k.normal_()
        v.normal_()
    lens = [5, 40, 17, 33][:live]
    table = torch.zeros(live, pool.num_pages, dtype=torch.int32)
    for row in range(live):
        table[row, :3] = torch.tensor([3 * row, 3 * row + 1, 3 * row + 2])
    slots = torch.tensor([int(table[r, (n - 1) // 16]) * 16 + (n - 1) % 16 for r, n in enumerate(lens)])
    ids = torch.tensor([11, 22, 33, 44][:live])
    positions = torch.tensor([[n - 1.0] * 3 for n in lens])
    inputs = {"ids": ids, "positions": positions, "slots": slots, "table": table, "lens": torch.tensor(lens).int()}
    inputs = {k: v.cuda() for k, v in inputs.items()}
    before = [k.clone() for k in storage.keys[:1]]
    graphed = program.decode_graph.run(live, inputs)["logits"].clone()
    # the same step from the host (the engine's way): small inputs in one upload, the table's used columns
    host = {k: v.cpu().numpy() for k, v in inputs.items()} | {"positions": positions, "table": table[:, :3].numpy()}
    assert torch.equal(program.decode_graph.run(live, host)["logits"], graphed)

    pad = {"ids": 0, "positions": 0.0, "slots": storage.scratch_slot, "table": 0, "lens": 0}
    padded = {k: torch.cat([v, torch.full_like(v[:1], pad[k])]) for k, v in inputs.items()}
    kv4 = DecodeKV(storage, padded["slots"], padded["table"], padded["lens"], "triton")
    eager4 = program.thinker(padded["ids"], padded["positions"].T, kv4, all_logits=True).logits[:live]
    kv3 = DecodeKV(storage, inputs["slots"], inputs["table"], inputs["lens"], "triton")
    eager3 = program.thinker(inputs["ids"], inputs["positions"].T, kv3, all_logits=True).logits
    if live < 4:  # the 4-row eager batch (last row padding) is the graph's shape
        assert torch.equal(graphed, eager4)
    cos = torch.nn.functional.cosine_similarity(graphed.float(), eager3.float(), dim=-1).min().item()
    exact = torch.equal(graphed, eager3)
    print(f"GPU-GRAPHS {live} live rows, graph vs eager {live}-row batch: min cosine {cos:.6f}, bitwise equal {exact}")
    assert cos > 0.999
    changed = (storage.keys[0] != before[0]).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert sorted(changed) == sorted({*slots.tolist(), storage.scratch_slot})


@pytest.mark.gpu
@torch.inference_mode()
@pytest.mark.parametrize("frames,fresh", VocoderStreamConfig().chunk_kinds())
def test_vocoder_graph_equals_eager_on_the_same_rows(frames, fresh):
    """Three streams replayed in the 4-row vocoder graph of each chunk kind of the schedule (every
    width a stream decodes at) equal eager over the same 4 rows (the 4th decoding into the scratch
    row) exactly; their pool rows get the same state. Also reported: whether a stream decoded in a
    batch equals it decoded alone (batch invariance of the kernels)."""
    omni = gpu_omni(4)
    program = omni.engine.stages["vocoder"].program
    assert sorted(program.graphs) == sorted(VocoderStreamConfig().chunk_kinds())  # a graph for every kind
    cfg = program.vocoder.cfg
    decoded = 0  # the frames a stream decoded before a chunk of this kind
    while (program.config.next_chunk(decoded), decoded == 0) != (frames, fresh):
        decoded += program.config.next_chunk(decoded)
    g = torch.Generator(device="cuda").manual_seed(0)
    history = torch.randint(0, cfg.codebook_size, (3, decoded, cfg.num_quantizers), device="cuda", generator=g)
    codes = torch.randint(0, cfg.codebook_size, (3, frames, cfg.num_quantizers), device="cuda", generator=g)
    slots = torch.tensor([2, 0, 1], device="cuda")

    def start():  # the streams' state before the chunk (a fresh chunk reads none)
        if not fresh:
            program._decode(history, slots, fresh=True)

    start()
    graphed = program.graphs[(frames, fresh)].run(3, {"codes": codes, "slots": slots})["wav"].clone()
    after_graph = [t.clone() for t in program.pool.keys + program.pool.conv]
    start()
    pad = torch.zeros_like(codes[:1])
    eager4 = program._decode(torch.cat([codes, pad]), torch.cat([slots, slots.new_tensor([program.scratch])]), fresh)
    after_eager = [t.clone() for t in program.pool.keys + program.pool.conv]
    start()
    alone = torch.cat([program._decode(codes[i : i + 1], slots[i : i + 1], fresh)["wav"] for i in range(3)])
    exact = torch.equal(graphed, eager4["wav"][:3])
    batch_invariant = torch.equal(graphed, alone)
    print(
        f"GPU-GRAPHS vocoder {'first' if fresh else 'later'} chunk of {frames} frames after {decoded}: "
        f"graph vs eager (same rows) bitwise {exact}; batch of 3 vs alone: bitwise {batch_invariant}, "
        f"max abs {(graphed - alone).abs().max().item():.2e}"
    )
    assert exact
    assert all(torch.equal(a[:3], b[:3]) for a, b in zip(after_graph, after_eager, strict=True))
    torch.testing.assert_close(graphed, alone, atol=2e-2, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(5, 2048), (1, 1024), (300, 128), (0, 2048)])
def test_triton_rms_norm_matches_reference(shape):
    from omniwalk.layers.norm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-6).to("cuda", torch.bfloat16)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3
    ref = norm(x)
    norm.use_fused_kernel()
    ours = norm(x)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if x.numel():
        differ = (ours != ref).float().mean().item()
        print(f"GPU-PARITY triton RMSNorm {shape}: {differ:.4%} of elements differ (1 bf16 step at most)")
        torch.testing.assert_close(ours, ref, rtol=8e-3, atol=8e-3)
        assert differ == 0  # the same rounding steps: bitwise equal (measured on the H200)


@pytest.mark.gpu
def test_packed_prefill_equals_per_request_prefill_through_the_engine():
    """Prompt chunks (16 tokens a step, so later chunks attend to cached ones) through one packed
    varlen call vs per-request SDPA: the same ids and logprobs to bf16 rounding (a tiny random model has
    near-ties, where bf16 noise may pick the other token: allowed only where the top two are that close)."""
    from helpers.qwen3_omni import checkpoint

    from omniwalk import Omni

    def run(backend):
        omni = Omni(
            model=checkpoint("tiny"),
            device="cuda",
            dtype="bfloat16",
            attention_backend=backend,
            max_batch_tokens=16,
            thinker_kv_bytes=64 * 2**20,
            talker_kv_bytes=16 * 2**20,
        )
        return omni.generate([r for r in gpu_requests() if r["temperature"] == 0.0])

    packed, per_request = run("torch_varlen"), run("reference")
    for i, (x, y) in enumerate(zip(packed, per_request, strict=True)):
        # Greedy ids match until the first near-tie of the reference (top-2 logprobs within bf16 noise, where
        # either pick is right); up to there every logprob agrees to bf16 rounding.
        pairs = list(zip(x.logprobs, y.logprobs, strict=True))
        split = next((n for n, (p, q) in enumerate(pairs) if p.token_id != q.token_id), len(pairs))
        err = max(abs(p.logprob - q.logprob) for p, q in pairs[: split + 1])
        margin = y.logprobs[split].top[0][1] - y.logprobs[split].top[1][1] if split < len(pairs) else None
        print(
            f"GPU-PREFILL request {i}: ids equal for {split} of {len(pairs)} tokens, max logprob difference "
            f"{err:.2e} up to there" + (f"; reference's top-2 margin there {margin:.2e}" if margin is not None else "")
        )
        assert err < 0.1
        assert margin is None or margin < 0.1


@pytest.mark.gpu
@torch.inference_mode()
def test_prefill_graph_equals_eager_on_the_same_padded_layout():
    """A thinker prefill step of two chunks (a first one, and one after cached tokens) replayed in
    its bucket's graph equals the eager decoder over the same padded layout bit for bit, and the
    unpadded eager step closely (other GEMM shapes)."""
    from omniwalk.engine.paged_attention import PagedBatch, Segment
    from omniwalk.engine.prefill_graphs import PrefillKV, kv_inputs

    omni = gpu_omni(4)
    stage = omni.engine.stages["thinker"]
    program, storage = stage.program, stage.storage
    for k, v in zip(storage.keys, storage.values, strict=True):
        k.normal_()
        v.normal_()
    tables = [PageTable(), PageTable()]
    for table, (cached, new) in zip(tables, [(0, 40), (30, 20)], strict=True):
        table.reserve(storage.pool, cached + new)
        table.num_cached = cached
    segments = [Segment(tables[0], 40), Segment(tables[1], 20)]
    kv = PagedBatch(storage, segments, "cuda", "triton", "torch_varlen")
    hidden = program.thinker.cfg.hidden_size
    x = torch.randn(60, hidden, device="cuda", dtype=torch.bfloat16)
    positions = torch.cat([torch.arange(40.0), torch.arange(30.0, 50.0)])[:, None].expand(60, 3).cuda()
    bucket = program.prefill_graphs.pick(kv)
    assert bucket is not None
    graphed = program.prefill_graphs.run(bucket, kv, {"x": x, "positions": positions})["hidden"][:60].clone()

    t = bucket.num_tokens
    padded_kv = PrefillKV(
        storage, *kv_inputs(bucket, storage, segments, "cuda").values(), bucket.max_seqlen, 2 * t, "torch_varlen"
    )
    pad = lambda r: torch.cat([r, r.new_zeros(t - 60, *r.shape[1:])])  # noqa: E731
    deepstack = x.new_zeros(t, program.deepstack_levels, hidden)
    eager_padded = program._decoder(padded_kv, pad(x), pad(positions), deepstack)["hidden"][:60]
    eager = program._decoder(kv, x, positions)["hidden"]
    cos = torch.nn.functional.cosine_similarity(graphed.float(), eager.float(), dim=-1).min().item()
    exact = torch.equal(graphed, eager_padded)
    print(f"GPU-PREFILL-GRAPH bucket {bucket}: graph vs eager padded bitwise {exact}; vs unpadded min cosine {cos:.6f}")
    assert exact and cos > 0.999


@pytest.mark.gpu
def test_prefill_graphs_through_the_engine():
    """Prefill graphs on and off (decode graphs on in both): greedy ids the same until a near tie
    of the eager run (top-2 logprobs within bf16 noise), logprobs close up to there."""
    on, off = gpu_omni(8), gpu_omni(8, prefill_graph_max_tokens=0)
    requests = [r for r in gpu_requests() if r["temperature"] == 0.0]
    a, b = on.generate(requests), off.generate(requests)
    stats = on.engine.stats()
    print(f"GPU-PREFILL-GRAPH stats thinker={stats['thinker']} talker={stats['talker']}")
    assert stats["thinker"]["prefill_graph_replays"] > 0 and stats["talker"]["prefill_graph_replays"] > 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        pairs = list(zip(x.logprobs, y.logprobs, strict=True))
        split = next((n for n, (p, q) in enumerate(pairs) if p.token_id != q.token_id), len(pairs))
        err = max(abs(p.logprob - q.logprob) for p, q in pairs[: split + 1])
        margin = y.logprobs[split].top[0][1] - y.logprobs[split].top[1][1] if split < len(pairs) else None
        codes = None if x.codes is None else torch.equal(x.codes, y.codes)
        print(
            f"GPU-PREFILL-GRAPH request {i}: ids equal for {split} of {len(pairs)}, max logprob difference "
            f"{err:.2e}, codes equal {codes}"
        )
        assert err < 0.1 and (margin is None or margin < 0.1)


def _storage():
    torch.manual_seed(0)
    storage = KVStorage(PagePool(64, 4), 1, 2, 8, torch.float32, "cpu")
    storage.keys[0].normal_()
    storage.values[0].normal_()
    return storage


def _segments(storage, cached_and_new):
    segments = []
    for cached, new in cached_and_new:
        table = PageTable()
        table.reserve(storage.pool, cached + new)
        table.num_cached = cached
        segments.append(Segment(table, new))
    return segments


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_padded_layout_attends_like_the_unpadded_step():
    """Chunks after cached keys and first chunks, padded to a bucket: the real rows' attention
    output is the unpadded step's; padding writes only the scratch slot."""
    storage = _storage()
    segments = _segments(storage, [(5, 3), (0, 6), (9, 1)])
    bucket = Bucket(32, 4, 16)
    kv = PagedBatch(storage, segments, "cpu", prefill_backend="reference")
    assert fits(bucket, kv) and not fits(Bucket(12, 4, 12), kv)  # 14 cached keys: more than T
    inputs = kv_inputs(bucket, storage, segments, "cpu")
    assert inputs["new_slots"].shape == (32,) and inputs["key_slots"].shape == (64,)
    assert inputs["cu_q"].tolist()[:5] == [0, 3, 9, 10, 26] and inputs["cu_q"][-1] == 32
    assert inputs["cu_k"].tolist()[:5] == [0, 8, 14, 24, 40] and inputs["cu_k"][-1] == 46
    q, k, v = (torch.randn(32, h, 8) for h in (4, 2, 2))
    expected = kv.attend(0, q[:10], k[:10], v[:10])
    keys_after = storage.keys[0].clone()
    padded = PrefillKV(storage, *inputs.values(), bucket.max_seqlen, 64, "reference")
    got = padded.attend(0, q, k, v)
    torch.testing.assert_close(got[:10], expected, rtol=0, atol=1e-6)  # (SDPA with a mask vs per-segment causal)
    changed = (storage.keys[0] != keys_after).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert changed == [storage.scratch_slot]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_prefill_graph_path_equals_eager_through_the_engine(monkeypatch):
    """Every path (DeepStack rows for images, talker prefixes, chunks after cached tokens with a
    small budget), its prefill run through the padded graph path: the same ids, codes and audio as
    each request alone on the eager path."""
    monkeypatch.setattr(prefill_graphs, "KeyedGraphs", EagerReplay)
    o = Omni(model=checkpoint("tiny"), max_batch_tokens=256, talker_max_batch_tokens=256)
    for name in ("thinker", "talker"):
        stage = o.engine.stages[name]
        stage.program.prefill = PrefillPlan(256, "reference")
        stage.capture_graphs()
    requests = [make_request(i, PATHS[i % len(PATHS)]) for i in range(12)]
    outs = run_staggered(o, requests)
    for i, request in enumerate(requests):
        assert_same(outs[request["request_id"]], alone(i))
    stats = o.engine.stats()
    assert stats["thinker"]["prefill_graph_replays"] > 0 and stats["talker"]["prefill_graph_replays"] > 0
