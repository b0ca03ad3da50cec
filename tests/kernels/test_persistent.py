"""The persistent code-predictor kernels (``kernels/persistent.py``, Triton; ``kernels/cuda_frame.py``,
CUDA): the Triton kernel's schedule checked by the model of its reads and writes, its frame against
``CodePredictor.forward`` on the reference path (CPU: Triton's interpreter in fp32, every frame's codes
equal); the CUDA kernel's plan (its shapes' checks, its blocks' rows); and both on the GPU at full size in
bf16 against the layered fast path (``gpu``: 64 frames at B = 1, 2, 4, their draws apart from the layered
path's no more often than the PyTorch reference's); the benchmark's reading of the CUDA kernel's trace."""

import dataclasses
import random
import sys
from pathlib import Path

import pytest
import torch
from helpers.triton_cpu import CPU_ONLY

from omniwalk.kernels.persistent_schedule import ATTN, DONE, DOWN, GATE_UP, OUT, SAMPLE, SELECT, Schedule, Shape
from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import TINY_CONFIG, load_config_dict
from omniwalk.models.qwen3_omni.networks.talker import CodePredictor
from omniwalk.sampling import BatchParams, SamplerState, SamplingParams, draw_reference

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=64, groups=5)
FULL = dict(layers=5, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=2048, groups=16)
SPLIT = dict(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, intermediate=192, vocab=64, groups=4)


@pytest.mark.parametrize(
    "shape",
    [Shape(1, **SMALL), Shape(3, **SMALL), Shape(2, **SPLIT), Shape(1, **{**FULL, "layers": 2, "groups": 3})],
)
def test_every_access_waits_for_what_it_reads_and_overwrites(shape):
    """The model of the tiles' reads and writes, ordered by their waits: a tile reads only what was
    written before it in the frame run step by step, after waiting for its writer, and overwrites nothing
    a tile before it still reads (the last case: full-size widths, 2 layers and 2 passes)."""
    schedule = Schedule(shape)
    schedule.check()
    ops = [step.op for step in schedule.steps]
    assert len(ops) == (shape.groups - 1) * (5 * shape.layers + 3) and ops.count(SAMPLE) == shape.groups - 1
    assert [step.tiles for step in schedule.steps if step.op == SELECT][0] == shape.batch * shape.parts
    assert [step.tokens for step in schedule.steps if step.op == SAMPLE] == [2] + [1] * (shape.groups - 2)
    assert schedule.num_tiles == sum(step.tiles for step in schedule.steps)


def test_the_check_finds_a_missing_or_wrong_wait():
    """The check is a real one: an attention tile waiting for another kv head's QKV tiles, the MLP's
    input waiting for nothing, a layer's attention skipped in an earlier pass (its keys read where
    nothing stored them), or a wait counting more tiles than signal it, is refused."""
    shape = Shape(2, **SPLIT)
    wrong_head = Schedule(shape)
    wrong_head.waits = lambda index, tile: _wrong_kv_head(wrong_head, index, tile)
    with pytest.raises(ValueError, match="without waiting for its writer"):
        wrong_head.check()
    unordered = Schedule(shape)
    unordered.waits = lambda index, tile: (
        [] if unordered.steps[index].op == GATE_UP else Schedule.waits(unordered, index, tile)
    )
    with pytest.raises(ValueError, match="without waiting"):
        unordered.check()
    skipped = Schedule(shape)
    first_attention = next(i for i, step in enumerate(skipped.steps) if step.op == ATTN)
    skipped.steps[first_attention] = dataclasses.replace(skipped.steps[first_attention], tiles=0)
    with pytest.raises(ValueError, match="waits for .* signal it|nothing wrote before it"):
        skipped.check()
    greedy = Schedule(shape)
    greedy.waits = lambda index, tile: [(p, c, n + 1) for p, c, n in Schedule.waits(greedy, index, tile)]
    with pytest.raises(ValueError, match="signal it"):
        greedy.check()


def _wrong_kv_head(schedule, index: int, tile: int):
    waits = Schedule.waits(schedule, index, tile)
    if schedule.steps[index].op == ATTN:
        kv_heads = schedule.shape.kv_heads
        return [(p, 1 + (c - 1 + 1) % kv_heads, n) for p, c, n in waits]
    return waits


def test_claiming_runs_every_tile_once_in_any_interleaving():
    """The counters' protocol, modelled step by step as the kernel runs it: a program claims the frame's
    tiles in order from one counter, taking its next ticket as it starts a tile; a tile waits for its
    producer's counters (``Schedule.waits``), runs, and counts itself in its counter (``signals``; an OUT
    or DOWN tile counts its column block's part, and the tile that counts the last one reduces the block
    and counts DONE). Programs interleave at random and start late (a GPU busy with another stream): the
    frame never stalls, every tile runs once, none before what it waits for is counted, and each column
    block is reduced once, after all its parts."""
    schedule = Schedule(Shape(2, **SPLIT))
    steps, total = schedule.steps, schedule.num_tiles
    where = [(index, tile) for index, step in enumerate(steps) for tile in range(step.tiles)]
    splits = [schedule.shape.splits(step.op) for step in steps]
    late = 0
    for seed in range(20):
        rng = random.Random(seed)
        programs = rng.randint(1, 9)
        claimed, counts, runs, reduced = 0, {}, [0] * total, {}
        state = [None] * programs  # a started program: its tile, its next ticket, and its stage in the tile

        while claimed < total or any(s is not None and s["tile"] < total for s in state):
            moved = False
            for i in rng.sample(range(programs), programs):
                s = state[i]
                if s is None:  # not resident yet
                    if i == 0 or rng.random() < 0.05:
                        state[i] = dict(tile=claimed, following=None, stage="start")
                        claimed, moved, late = claimed + 1, True, late + (claimed > 0)
                    continue
                if s["tile"] >= total:
                    continue
                index, tile = where[s["tile"]]
                if s["stage"] == "start":  # the next ticket, then the wait
                    s["following"], claimed, s["stage"] = claimed, claimed + 1, "wait"
                elif s["stage"] == "wait":
                    if all(counts.get((p, c), 0) >= n for p, c, n in schedule.waits(index, tile)):
                        runs[s["tile"]] += 1
                        s["stage"] = "signal"
                    else:
                        continue  # (spinning is not progress)
                else:  # the count; an OUT / DOWN block's last part reduces the block, then counts DONE
                    key = (index, schedule.signals(index, tile))
                    counts[key] = counts.get(key, 0) + 1
                    if splits[index] and counts[key] == splits[index]:
                        reduced[key] = reduced.get(key, 0) + 1
                        counts[(index, DONE)] = counts.get((index, DONE), 0) + 1
                    s["tile"], s["stage"] = s["following"], "start"
                moved = True
                break
            assert moved or any(s is None for s in state), f"seed {seed}: no program can go on"
        assert runs == [1] * total
        blocks = schedule.shape.hidden_blocks
        assert sorted(reduced) == sorted(
            (i, 1 + c) for i, st in enumerate(steps) if st.op in (OUT, DOWN) for c in range(blocks)
        )
        assert set(reduced.values()) == {1}
    assert late > 20  # (programs did start after others had claimed tiles)


def _params(batch, vocab, device, sampled=True, seed=0, top=(50, 0.8)):
    states = []
    for row in range(batch):
        params = SamplingParams(temperature=1.0 if sampled else 0.0, top_k=top[0], top_p=top[1], seed=seed + row)
        state = SamplerState(params, (), [])
        state.num_generated = 3 * row
        states.append(state)
    return BatchParams.of(states, vocab, device)


# the tiny config's code predictor has one kv head and its output projections one or two splits; WIDE has
# several of each, so that every wait of the kernel counts on more than one group of tiles, tiles 32
# columns wide (head_dim 32; the tiny one: 16) and two SELECT tiles a request (512 ids; the others: 256)
WIDE = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=32, intermediate_size=192, vocab_size=512)
# a draw's top-k / top-p: the served one (each part hands the draw its best 64 ids), none (each part its best
# perturbed id), and a top_k over 64 (the draw sorts the whole row)
TOPS = {"top": (50, 0.8), "none": (0, 1.0), "wide": (100, 0.9)}


@CPU_ONLY
@torch.no_grad()
@pytest.mark.parametrize(
    ("batch", "sampled", "wide", "top"),
    [(1, True, False, "top"), (3, True, False, "none"), (4, False, False, "top"), (2, True, True, "top")]
    + [(2, True, True, "none"), (1, True, True, "wide")],
)
def test_a_frame_in_one_launch_equals_the_code_predictor(interpreter, batch, sampled, wide, top):
    """In Triton's interpreter (one program, the tiles in claim order: every wait must be met when reached,
    else the launcher raises), a frame's codes equal ``CodePredictor.forward`` + ``draw_reference``."""
    raw = load_config_dict(TINY_CONFIG)
    raw["talker_config"]["code_predictor_config"]["vocab_size"] = 256  # (the interpreter's sorts are slow)
    if wide:
        raw["talker_config"]["code_predictor_config"].update(WIDE)
    cfg = Qwen3OmniConfig.from_hf(raw).talker
    cp = CodePredictor(cfg.code_predictor, cfg.num_code_groups).eval()
    randomize(cp, 7)
    gen = torch.Generator().manual_seed(batch)
    hidden, code0 = (torch.randn(batch, cp.cfg.hidden_size, generator=gen) for _ in range(2))
    params = _params(batch, cp.cfg.vocab_size, "cpu", sampled, top=TOPS[top])
    want_codes, want_total = cp(hidden, code0, lambda logits, i: draw_reference(logits, params, i))
    cp.use_persistent_kernel()
    codes, total = cp.persistent(hidden, code0, params)
    assert torch.equal(codes, want_codes)
    torch.testing.assert_close(total, want_total, rtol=1e-5, atol=1e-5)
    again = cp.draw_groups(hidden, code0, params)  # (the same through the module's entry)
    assert torch.equal(again[0], codes)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("kind", ["triton", "cuda"])
@pytest.mark.parametrize("batch", [1, 2, 4])
def test_frames_in_one_launch_equal_the_layered_fast_path_at_full_size(batch, kind):
    """Full size, bf16, random weights: 64 frames (fresh inputs and sampling steps each) drawn by the
    persistent kernel, by the layered fused kernels and by the PyTorch reference (same weights). Each sums
    its products in its own order, so bf16 logits may differ by a rounding step and a draw at a near-tie may
    go the other way (then the frame's later groups follow different inputs). Compared with the layered
    path up to each frame's first difference, the persistent kernel's draws differ at most twice as often
    (+0.5%) as the reference's do; frames drawn alike have running sums equal to bf16 rounding. Then frames
    replayed from a CUDA graph of the kernel equal its eager launches exactly."""
    from helpers.gpu_pairs import randomize_, real_config_dict

    from omniwalk.sampling import draw

    cfg = Qwen3OmniConfig.from_hf(real_config_dict()).talker
    with torch.device("cuda"):
        cp = CodePredictor(cfg.code_predictor, cfg.num_code_groups).to(torch.bfloat16).eval()
        reference = CodePredictor(cfg.code_predictor, cfg.num_code_groups).to(torch.bfloat16).eval()
    randomize_(cp, 3)
    reference.load_state_dict(cp.state_dict())
    use_kernels(cp, "fused")
    cp.use_persistent_kernel(kind)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    hidden_size, vocab = cfg.code_predictor.hidden_size, cfg.code_predictor.vocab_size
    frames, counts = [], {"persistent": [0, 0], "reference": [0, 0]}  # draws compared, draws that differ
    for frame in range(64):
        inputs = [torch.randn(batch, hidden_size, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        params = _params(batch, vocab, "cuda", sampled=frame % 4 != 3, seed=10 * frame)
        want = cp(*inputs, lambda logits, i: draw(logits, params, i))  # noqa: B023 (called at once)
        got = cp.persistent(*inputs, params)
        frames.append((inputs, params, got))
        other = reference(*inputs, lambda logits, i: draw(logits, params, i))  # noqa: B023
        for name, codes in (("persistent", got), ("reference", other)):
            for row in range(batch):
                same = (codes[0][row] == want[0][row]).tolist()
                first = same.index(False) if False in same else len(same)
                counts[name][0] += min(first + 1, len(same))
                counts[name][1] += first < len(same)
                if first == len(same) and name == "persistent":
                    torch.testing.assert_close(codes[1][row], want[1][row], rtol=2e-2, atol=2e-2)
    if kind == "cuda":
        cp.persistent.check()
    print(f"{kind} B={batch}: draws differing from the layered path's (compared, differing): {counts}")
    (compared, differing), (ref_compared, ref_differing) = counts["persistent"], counts["reference"]
    assert differing / compared <= 2 * ref_differing / ref_compared + 0.005
    static = [torch.zeros_like(t) for t in frames[0][0]]
    params = _params(batch, vocab, "cuda", seed=0)
    cp.persistent(*static, params)  # (compiled before the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes, total = cp.persistent(*static, params)
    for inputs, frame_params, (want_codes, want_total) in [f for i, f in enumerate(frames) if i % 4 != 3][:6]:
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src)
        for name in ("temperature", "top_k", "top_p", "sampled", "seeds", "steps"):
            getattr(params, name).copy_(getattr(frame_params, name))
        graph.replay()
        assert torch.equal(codes, want_codes) and torch.equal(total, want_total)


@pytest.mark.parametrize("blocks", [132, 114])
def test_the_cuda_frame_plan_fits_every_batch_and_splits_every_projection(blocks):
    """The CUDA kernel's plan at full size (H100 / H200 SXM: 132 SMs; H100 PCIe: 114): every batch up to
    MAX_BATCH fits one block's shared memory with a ring that holds a step's rows and the chunks in flight;
    the blocks' rows of each projection cover it once, in order (the kernel's ``share_start``); the
    outputs' words are as the kernel lays them out."""
    from omniwalk.kernels.cuda_frame import CHUNK, MAX_BATCH, SHARED_BYTES, FramePlan, source

    full = {k: FULL[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")}
    for batch in range(1, MAX_BATCH + 1):
        plan = FramePlan(batch, **full, groups=FULL["groups"], eps=1e-6, blocks=blocks)
        plan.check()
        assert plan.shared <= SHARED_BYTES and plan.step_chunks() <= plan.ring_chunks
        assert plan.ring_chunks * CHUNK >= 128 * 1024  # (16 chunks or more: the stream runs ahead a step)
        for n, _ in plan.step_widths():
            rows = [r for b in range(blocks) for r in plan.share(n, b)]
            assert rows == list(range(n))
        layer = 2 * batch * (4096 + 2048 + 1024 + 3072 + 1024)
        assert plan.words() == 15 * (5 * layer + batch * 2048 + 4)  # (+ the codes, padded to 4 words)
        assert f"#define BATCH {batch}\n" in source(plan) and "#define EPS 1.000000000e-06f\n" in source(plan)


def test_the_cuda_frame_plan_refuses_what_the_kernel_does_not_take():
    from omniwalk.kernels.cuda_frame import FramePlan

    full = {k: FULL[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")}
    cases = {
        "batch 5 over 4": dict(batch=5),
        "not a power of two": dict(head_dim=96),
        "over 480 threads": dict(heads=32, kv_heads=4),
        "attention tiles": dict(blocks=4),
        "the ring holds": dict(intermediate=12288),
        "over 65536": dict(vocab=65540),
    }
    for reason, change in cases.items():
        args = dict(batch=1, **full, groups=FULL["groups"], eps=1e-6, blocks=132) | change
        with pytest.raises(ValueError, match=reason):
            FramePlan(**args).check()


def _cuda_frame_accesses(plan):
    """The CUDA kernel's steps as it runs them, each a list of (block, "w" or "r", word ranges): what each
    block writes and reads of the outputs' words (``FramePlan.layout``, the numbers the kernel is built with;
    the blocks' rows ``FramePlan.share``). Reads of the pass's input (not in the words) are left out."""
    lay, b_, kv, hd = plan.layout(), plan.batch, plan.kv_heads, plan.head_dim
    group, attn_w = plan.heads // kv, plan.heads * hd
    widths = {"at_qkv": plan.qkv, "at_attn": attn_w, "at_res_a": plan.hidden, "at_act": plan.intermediate}
    widths["at_res_m"] = plan.hidden
    steps = []

    def rows_of(base, name, rows, cols):  # word ranges of rows x a column range
        return [
            (base + lay[name] + r * widths[name] + cols.start, base + lay[name] + r * widths[name] + cols.stop)
            for r in rows
        ]

    def everyone(kind, base, name, rows, n=None):  # each block: its share of n columns, or every column
        width = widths[name]
        return [
            (blk, kind, rows_of(base, name, rows, plan.share(n, blk) if n else range(width)))
            for blk in range(plan.blocks)
        ]

    for p in range(plan.groups - 1):
        tokens = 2 if p == 0 else 1
        rows = range(b_ * tokens)
        pw = p * lay["pass_words"]
        logits = pw + plan.layers * lay["layer_words"]
        if p > 0:  # the pass before's codes: drawn by every block (B = 1) or by block b for request b, handed on
            steps += _draw_accesses(plan, p - 1, handed_on=True)
        for layer in range(plan.layers):
            lw = pw + layer * lay["layer_words"]
            before = lw - lay["layer_words"]
            qkv = everyone("w", lw, "at_qkv", rows, plan.qkv)
            if layer:
                qkv += everyone("r", before, "at_res_m", rows)
            steps.append(qkv)
            attn = []
            for t in range(b_ * kv):
                blk, req, j = plan.blocks - 1 - t, t // kv, t % kv
                for i in range(tokens):
                    row = req * tokens + i
                    for col in [(j * group + g) * hd for g in range(group)] + [(plan.heads + j) * hd]:
                        attn.append((blk, "r", rows_of(lw, "at_qkv", [row], range(col, col + hd))))
                    v = (plan.heads + kv + j) * hd
                    attn.append((blk, "r", rows_of(lw, "at_qkv", [row], range(v, v + hd))))
                    attn.append((blk, "w", rows_of(lw, "at_attn", [row], range(j * group * hd, (j + 1) * group * hd))))
            steps.append(attn)
            out = everyone("r", lw, "at_attn", rows) + everyone("w", lw, "at_res_a", rows, plan.hidden)
            if layer:
                out += [
                    (blk, "r", rows_of(before, "at_res_m", rows, plan.share(plan.hidden, blk)))
                    for blk in range(plan.blocks)
                ]
            steps.append(out)
            steps.append(everyone("r", lw, "at_res_a", rows) + everyone("w", lw, "at_act", rows, plan.intermediate))
            down = everyone("r", lw, "at_act", rows) + everyone("w", lw, "at_res_m", rows, plan.hidden)
            down += [
                (blk, "r", rows_of(lw, "at_res_a", rows, plan.share(plan.hidden, blk))) for blk in range(plan.blocks)
            ]
            steps.append(down)
        last = pw + (plan.layers - 1) * lay["layer_words"]
        head = [
            (blk, "r", rows_of(last, "at_res_m", [r * tokens + tokens - 1 for r in range(b_)], range(plan.hidden)))
            for blk in range(plan.blocks)
        ]
        for blk in range(plan.blocks):
            cols = plan.share(plan.vocab, blk)
            head.append(
                (
                    blk,
                    "w",
                    [(logits + r * plan.vocab + cols.start, logits + r * plan.vocab + cols.stop) for r in range(b_)],
                )
            )
        steps.append(head)
    return steps + _draw_accesses(plan, plan.groups - 2, handed_on=False)  # (the last pass's: no one waits)


def _draw_accesses(plan, p, handed_on):
    """The steps of pass p's draw: at B = 1 every block reads the logits row (block 0 alone for the last
    pass); at more, block b reads row b and writes the pass's code word b, then (``handed_on``) every
    block reads the B code words."""
    lay, b_ = plan.layout(), plan.batch
    base = p * lay["pass_words"]
    logits, code_words = base + plan.layers * lay["layer_words"], base + lay["at_codes"]
    if b_ == 1:
        return [[(blk, "r", [(logits, logits + plan.vocab)]) for blk in range(plan.blocks if handed_on else 1)]]
    draw = []
    for b in range(b_):
        draw.append((b, "r", [(logits + b * plan.vocab, logits + (b + 1) * plan.vocab)]))
        draw.append((b, "w", [(code_words + b, code_words + b + 1)]))
    hand_on = [(blk, "r", [(code_words, code_words + b_)]) for blk in range(plan.blocks)]
    return [draw, hand_on] if handed_on else [draw]


@pytest.mark.parametrize(
    ("batch", "shape", "blocks"),
    [(1, "full", 132), (3, "full", 114), (2, "small", 9)],
)
def test_the_cuda_frame_reads_each_word_after_its_one_writer(batch, shape, blocks):
    """The CPU model of the CUDA kernel's dependencies: its steps run in the same order on every block, and a
    read waits for each word to carry the launch's epoch; so the frame finishes with the right values iff every
    word a step reads is written in the launch, once, by a step before it (on any block), and the words written
    are the used rows of every output. Checked at full-size widths (2 layers, 3 groups) and a small shape."""
    import numpy as np

    from omniwalk.kernels.cuda_frame import FramePlan

    dims = dict(FULL, layers=2, groups=3) if shape == "full" else dict(SMALL)
    plan = FramePlan(batch, **{k: dims[k] for k in FULL}, eps=1e-6, blocks=blocks)
    plan.check()
    writer = np.full(plan.words(), -1)
    reads = 0
    for index, step in enumerate(_cuda_frame_accesses(plan)):
        for _, kind, ranges in step:
            for lo, hi in ranges:
                if kind == "w":
                    assert (writer[lo:hi] == -1).all(), f"step {index} writes a word written before"
                    writer[lo:hi] = index
        for _, kind, ranges in step:
            for lo, hi in ranges:
                if kind == "r":
                    assert ((writer[lo:hi] >= 0) & (writer[lo:hi] < index)).all(), f"step {index} reads ahead"
                    reads += hi - lo
    lay, used = plan.layout(), 0
    for p in range(plan.groups - 1):
        rows = batch * (2 if p == 0 else 1)
        used += plan.layers * rows * lay["layer_words"] // (2 * batch) + batch * plan.vocab
        used += batch if batch > 1 else 0  # (the codes handed on)
    assert (writer >= 0).sum() == used and reads > used


@pytest.mark.gpu
@torch.no_grad()
def test_the_cuda_frames_first_layer_equals_its_steps_in_pytorch():
    """Full size, bf16, B = 2, greedy: the CUDA kernel's words of the first pass's first layer, each step
    recomputed in PyTorch from the kernel's own input to it (so that a wrong step is named, not only a wrong
    frame): q/k/v, attention (q/k norm, rope, causal softmax over the pass's two positions), the residual after
    the output projection, the MLP's activation, the residual after it; every word carries the launch's epoch
    and no wait gave up."""
    from helpers.gpu_pairs import randomize_, real_config_dict

    from omniwalk.layers.rotary import apply_rotary

    cfg = Qwen3OmniConfig.from_hf(real_config_dict()).talker
    with torch.device("cuda"):
        cp = CodePredictor(cfg.code_predictor, cfg.num_code_groups).to(torch.bfloat16).eval()
    randomize_(cp, 3)
    use_kernels(cp, "fused")
    cp.use_persistent_kernel("cuda")
    kernel, batch = cp.persistent, 2
    params = _params(batch, cfg.code_predictor.vocab_size, "cuda", sampled=False)
    gen = torch.Generator(device="cuda").manual_seed(5)
    h, c = (torch.randn(batch, 1024, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kernel(h, c, params)
    torch.cuda.synchronize()
    kernel.check()
    plan, words, *_, sync = kernel._built[batch]
    lay, rows, epoch = plan.layout(), 2 * batch, sync[0].item() % 65535  # (the launch's: sync[0] moved on after it)

    def output(name: str, width: int) -> torch.Tensor:
        w = words[lay[name] : lay[name] + rows * width].view(rows, width)
        assert ((w >> 16) & 0xFFFF).eq(epoch).all(), f"{name}: a word not written by the launch"
        return ((w & 0xFFFF) << 16).view(torch.float32).to(torch.bfloat16)

    def close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        err = (got.float() - want.float()).abs().max() / want.float().abs().max()
        assert err < 2e-2, f"{name}: {err.item():.3g} of its largest value apart"

    layer = cp.model.layers[0]
    x = torch.stack([h, c], dim=1).reshape(rows, -1)
    qkv = output("at_qkv", plan.qkv)
    close("q/k/v", qkv, torch.nn.functional.linear(layer.input_layernorm(x), kernel.weights.qkv[0]))
    heads, kv, hd = plan.heads, plan.kv_heads, plan.head_dim
    q = layer.self_attn.q_norm(qkv[:, : heads * hd].view(rows, heads, hd))
    k = layer.self_attn.k_norm(qkv[:, heads * hd : (heads + kv) * hd].view(rows, kv, hd))
    v = qkv[:, (heads + kv) * hd :].view(rows, kv, hd).float()
    positions = torch.arange(rows, device="cuda") % 2
    cos, sin = kernel.cos[positions][:, None], kernel.sin[positions][:, None]
    q, k = apply_rotary(q, cos, sin).float(), apply_rotary(k, cos, sin).float()
    want = torch.empty(rows, heads, hd, device="cuda")
    for row in range(rows):
        first = row - row % 2  # (the request's first token row)
        for head in range(heads):
            j = head // (heads // kv)
            scores = k[first : row + 1, j] @ q[row, head] * hd**-0.5
            want[row, head] = torch.softmax(scores, 0) @ v[first : row + 1, j]
    attn = output("at_attn", heads * hd)
    close("attention", attn, want.reshape(rows, -1))
    res_a = output("at_res_a", plan.hidden)
    close("residual after attention", res_a, x + torch.nn.functional.linear(attn, kernel.weights.o[0]))
    gate_up = torch.nn.functional.linear(layer.post_attention_layernorm(res_a), kernel.weights.gate_up[0])
    act = output("at_act", plan.intermediate)
    close(
        "activation", act, torch.nn.functional.silu(gate_up[:, : plan.intermediate]) * gate_up[:, plan.intermediate :]
    )
    close(
        "residual after the MLP",
        output("at_res_m", plan.hidden),
        res_a + torch.nn.functional.linear(act, kernel.weights.down[0]),
    )


def test_the_cuda_timeline_splits_a_frame_into_steps_and_what_lies_between_them():
    """``benchmarks/kernels/persistent.py``'s reading of a traced frame (a synthetic one: every step 1 us
    waiting for its input, 2 for weights, then rows for 3 us plus its kind's index (QKV 0 .. HEAD 5); ATTN only
    on the last block, an instant elsewhere; a draw after each pass's head but the last: 4 us for its logits,
    then 1 us to its top-k / top-p set and 2 more; 0.5 us before every step and draw)."""
    sys.path[:0] = [str(ROOT / "benchmarks" / "kernels"), str(ROOT / "benchmarks")]
    from persistent import CUDA_OPS, cuda_phases

    layers, passes, blocks = 2, 3, 3
    per_pass = 5 * layers + 1
    steps = passes * per_pass
    trace = torch.zeros(blocks, steps + passes, 4, dtype=torch.int64)
    busy = [0.0] * blocks
    for b in range(blocks):
        runs = []  # (row, its phases' offsets) in the order the block runs them
        for i in range(steps):
            kind = i % per_pass % 5 if i % per_pass < 5 * layers else 5
            attends = kind != 1 or b == blocks - 1
            runs.append((i, (0.0, 1.0, 3.0, 6.0 + kind) if attends else (0.0, 0.0, 0.0, 0.0)))
            if kind == 5 and i // per_pass < passes - 1:
                runs.append((steps + i // per_pass, (0.0, 4.0, 5.0, 7.0)))
        now = -0.5
        for row, offsets in runs:
            now += 0.5
            trace[b, row] = torch.tensor([int((now + at) * 1000) for at in offsets])
            now += offsets[-1]
            busy[b] += offsets[-1]
    out = cuda_phases(trace, layers, attending=1)
    for kind, op in enumerate((*CUDA_OPS, "HEAD")):
        if op != "ATTN":
            assert out["ops"][op] == [1.0, 2.0, 3.0 + kind, 6.0 + kind, 0.5], op
    assert out["ops"]["ATTN"] == ["-", "-", "-", 7.0, 0.5]
    assert out["ops"]["draw"] == [4.0, "-", 3.0, 7.0, 0.5] and out["draw_selection_us"] == 1.0
    assert out["busy_us"] == pytest.approx(sum(busy) / blocks)
    assert out["between_us"] == (steps + passes - 2) * 0.5
    assert out["frame_us"] == pytest.approx(busy[-1] + out["between_us"])  # (the block that attends is the last)
