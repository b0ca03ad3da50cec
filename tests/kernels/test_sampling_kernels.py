"""The fused sampling kernels against ``sampling.draw_reference``.

On the CPU through Triton's interpreter: small vocabularies (the interpreter runs a sort's steps in
Python); 5000 takes the split large-vocabulary path. NOTE: TRITON_INTERPRET is set before triton is
imported (``conftest.py``): triton's own jit library, ``tl.sort``/``tl.topk``, is defined at its import.
On the GPU (``gpu``), compiled, against the reference on the same device and inputs: the noise bit for
bit; the ids of random draws at the sizes in use (2048 code predictor, 3072 talker, 152064 thinker; the
thinker's with grammar bitmasks), fp32 and bf16 logits, eager fields or a graph's full ones, and 16 draws
inside one captured CUDA graph (the talker frame's form, with a bitmask input).
"""

import pytest
import torch
from helpers.triton_cpu import CPU_ONLY, random_bitmask, random_logits, random_states, unexplained_rows

from omniwalk.kernels import sampling as sampling_kernels
from omniwalk.sampling import BatchParams, draw, draw_fused, draw_reference, gumbel_noise


@CPU_ONLY
@pytest.mark.parametrize(
    "vocab,dtype,graph,step_offset",
    [
        (40, torch.float32, False, 0),
        (64, torch.float32, True, 5),
        (100, torch.float32, True, 3),
        (100, torch.bfloat16, False, 1),
        (5000, torch.float32, False, 2),
        (5000, torch.bfloat16, True, 0),
    ],
)
def test_kernel_ids_equal_the_reference(interpreter, vocab, dtype, graph, step_offset):
    """Greedy and sampled rows, penalties, bans, grammar bitmasks, top-k either side of the partial
    sort, top-p, ties (integer logits), -inf ids; eager fields (None = skipped) or a graph's full,
    neutral ones."""
    gen = torch.Generator().manual_seed(vocab + step_offset)
    num_rows = 16
    logits = random_logits(num_rows, vocab, gen, dtype)
    p = BatchParams.of(random_states(num_rows, vocab, gen), vocab, "cpu")
    p.allowed = random_bitmask(num_rows, vocab, gen) if vocab != 64 else None
    if graph:
        p = p.with_all_fields(vocab)
        logits, p = _pad(logits, p)  # a bucket's padding row: neutral and greedy
    ids = draw_fused(logits, p, step_offset)
    wrong, near = unexplained_rows(ids, logits, p, step_offset, noise_tol=1e-5)
    assert wrong == [] and near <= 1


def _pad(logits: torch.Tensor, p: BatchParams) -> tuple[torch.Tensor, BatchParams]:
    neutral = {"temperature": 1.0, "penalty": 1.0, "seen": False, "banned": False, "allowed": -1}
    neutral["top_k"] = logits.shape[1]
    neutral |= {"top_p": 1.0, "sampled": False, "seeds": 3, "steps": 3}
    rows = {k: v if v is None else torch.cat([v, torch.full_like(v[:1], neutral[k])]) for k, v in vars(p).items()}
    return torch.cat([logits, logits[:1]]), BatchParams(**rows)


def _one_row(logits, top_k, sampled, seed):
    return BatchParams(
        temperature=torch.ones(1),
        top_k=torch.tensor([top_k]),
        top_p=torch.ones(1),
        sampled=torch.tensor([sampled]),
        seeds=torch.tensor([seed]),
        steps=torch.tensor([0]),
    )


@CPU_ONLY
@pytest.mark.parametrize("sampled", [False, True])
def test_ties_rank_by_index(interpreter, sampled):
    """Equal scores rank by index (the reference's stable sort; -0.0 equals +0.0): a top-k cut
    through a tie keeps the first ids, and argmax takes the first."""
    cases = [([1.0, 5.0, 5.0, 2.0, 5.0], 2, {1, 2}), ([-0.0, 0.0, -1.0, -2.0], 1, {0}), ([3.0] * 6, 3, {0, 1, 2})]
    for values, top_k, allowed in cases:
        logits = torch.tensor([values])
        for seed in range(6):
            p = _one_row(logits, top_k, sampled, seed)
            ids = draw_fused(logits, p)
            assert ids.tolist() == draw_reference(logits, p).tolist() and ids.item() in allowed


@CPU_ONLY
def test_kernel_noise_is_the_reference_hash(interpreter):
    """Same hash bits; the interpreter's numpy log may differ from torch's in the last bit."""
    seeds, steps = torch.tensor([0, 1, -(2**62), 2**62 + 5]), torch.tensor([0, 6933, 7, 2**40])
    ours, ref = sampling_kernels.gumbel_noise(seeds, steps, 3000), gumbel_noise(seeds, steps, 3000)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_kernel_noise_equals_the_reference_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**62), 2**62, (64,), generator=gen).cuda()
    steps = torch.randint(0, 2**40, (64,), generator=gen).cuda()
    assert torch.equal(sampling_kernels.gumbel_noise(seeds, steps, 152064), gumbel_noise(seeds, steps, 152064))


@pytest.mark.gpu
@pytest.mark.parametrize("graph_fields", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [2048, 3072, 152064])
def test_ids_equal_the_reference(vocab, dtype, graph_fields):
    gen = torch.Generator().manual_seed(vocab)
    num_rows = 64
    logits = random_logits(num_rows, vocab, gen, dtype, "cuda")
    p = BatchParams.of(random_states(num_rows, vocab, gen), vocab, "cuda")
    p.allowed = random_bitmask(num_rows, vocab, gen, "cuda") if vocab == 152064 else None  # (the thinker's)
    if graph_fields:
        p = p.with_all_fields(vocab)
    for step_offset in (0, 7):
        ids = draw(logits, p, step_offset)
        wrong, excused = unexplained_rows(ids, logits, p, step_offset, noise_tol=0.0)
        assert wrong == [] and excused <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [2048, 3072, 152064])
def test_greedy_batch_is_the_first_argmax(vocab):
    logits = torch.randint(-3, 4, (8, vocab), device="cuda").float()  # many ties
    ids = draw(logits, BatchParams(temperature=torch.ones(8, device="cuda")))
    assert torch.equal(ids, logits.argmax(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,dtype", [(2048, torch.bfloat16), (3072, torch.float32)])
def test_draws_inside_a_cuda_graph(vocab, dtype):
    """16 draws (step offsets 0..15) captured once, replayed over new logits and parameters."""
    gen = torch.Generator().manual_seed(vocab)
    num_rows, num_draws = 8, 16

    def inputs():  # (a grammar bitmask too: graph-compatible, though the engine's constrained draws run eagerly)
        logits = random_logits(num_draws * num_rows, vocab, gen, dtype, "cuda").view(num_draws, num_rows, vocab)
        p = BatchParams.of(random_states(num_rows, vocab, gen), vocab, "cuda").with_all_fields(vocab)
        p.allowed = random_bitmask(num_rows, vocab, gen, "cuda")
        return logits, p

    static_logits, static = inputs()
    draw(static_logits[0], static)  # (compiled before the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.stack([draw(static_logits[i], static, i) for i in range(num_draws)])
    for _ in range(3):
        logits, p = inputs()
        static_logits.copy_(logits)
        for name, value in vars(p).items():
            getattr(static, name).copy_(value)
        graph.replay()
        for i in range(num_draws):
            wrong, excused = unexplained_rows(out[i], logits[i], p, i, noise_tol=0.0)
            assert wrong == [] and excused <= 1
