"""The fused sampling kernels compiled on CUDA against ``sampling.draw_reference`` on the same
device and inputs: the noise bit for bit; the ids of random draws at the sizes in use (2048 code
predictor, 3072 talker, 152064 thinker; the thinker's with grammar bitmasks), fp32 and bf16 logits,
eager fields or a graph's full ones, and 16 draws inside one captured CUDA graph (the talker frame's
form, with a bitmask input)."""

import pytest
import torch
from helpers.triton_cpu import random_bitmask, random_logits, random_states, unexplained_rows

from omniwalk.kernels import sampling as sampling_kernels
from omniwalk.sampling import BatchParams, draw, gumbel_noise

pytestmark = pytest.mark.gpu


def test_kernel_noise_equals_the_reference_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**62), 2**62, (64,), generator=gen).cuda()
    steps = torch.randint(0, 2**40, (64,), generator=gen).cuda()
    assert torch.equal(sampling_kernels.gumbel_noise(seeds, steps, 152064), gumbel_noise(seeds, steps, 152064))


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


@pytest.mark.parametrize("vocab", [2048, 3072, 152064])
def test_greedy_batch_is_the_first_argmax(vocab):
    logits = torch.randint(-3, 4, (8, vocab), device="cuda").float()  # many ties
    ids = draw(logits, BatchParams(temperature=torch.ones(8, device="cuda")))
    assert torch.equal(ids, logits.argmax(-1))


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
