"""The batched LoRA op: the reference against a per-row loop in float64, and the Triton kernels (on the CPU
through Triton's interpreter) against the reference: mixed slots, -1 rows, ranks padded to the pool's,
a column slice of a wider y, M from a decode step to a prefill chunk, fp32 and bf16."""

import pytest
import torch
from helpers.triton_cpu import CPU_ONLY

from omniwalk.lora.ops import add_lora

SLOTS, MAX_RANK, N_IN, N_OUT = 3, 16, 40, 24


def pool_weights(dtype, ranks=(8, 16, 4), max_rank=MAX_RANK, seed=0, n_in=N_IN):
    """a [S, R, in], b [S, out, R] with each slot's rank zero-padded to R (as a pool holds them)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.zeros(SLOTS, max_rank, n_in), torch.zeros(SLOTS, N_OUT, max_rank)
    for s, r in enumerate(ranks):
        a[s, :r] = torch.randn(r, n_in, generator=g) / n_in**0.5
        b[s, :, :r] = torch.randn(N_OUT, r, generator=g)
    return a.to(dtype), b.to(dtype)


def rows(m: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(-1, SLOTS, (m,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def per_row(y, x, a, b, slots):
    """y + each row's delta, row by row in float64."""
    out = y.double().clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            out[i] += (x[i].double() @ a[s].double().T) @ b[s].double().T
    return out


@pytest.mark.parametrize("m", [1, 3, 64, 300])
def test_reference_is_each_rows_own_adapter(m):
    a, b = pool_weights(torch.float32)
    x = torch.randn(m, N_IN, generator=torch.Generator().manual_seed(2))
    wide = torch.randn(m, N_OUT + 10, generator=torch.Generator().manual_seed(3))
    before = wide.clone()
    y = wide[:, 5 : 5 + N_OUT]  # a column slice: row stride N_OUT + 10
    slots = rows(m)
    expected = per_row(y, x, a, b, slots)
    add_lora(y, x, a, b, slots)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    base = slots < 0
    assert torch.equal(wide[base], before[base])  # the base model's rows untouched, bitwise
    assert torch.equal(wide[:, :5], before[:, :5]) and torch.equal(wide[:, 5 + N_OUT :], before[:, 5 + N_OUT :])


CASES = {  # name -> (pool rank, each slot's rank, in): a wide ``in`` splits the shrink over programs
    "ranks_8_16_4_of_16": (16, (8, 16, 4), N_IN),
    "ranks_8_16_64_of_64": (64, (8, 16, 64), N_IN),
    "in_600_split": (16, (8, 16, 4), 600),
    "in_2200_many_splits": (64, (8, 16, 64), 2200),  # (more than 16 partials per row; few rows: interpreted)
}


def case_operands(m: int, case: str, dtype, first_slot: int = 1):
    """A pool of ``case`` (a, b), x [M, in], a y wider than the output (its columns 5 ... are y) and the
    rows' slots, the first two ``first_slot`` and -1 (a used and a base row in every case)."""
    max_rank, ranks, n_in = CASES[case]
    a, b = pool_weights(dtype, ranks=ranks, max_rank=max_rank, n_in=n_in)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, n_in, generator=g).to(dtype)
    wide = torch.randn(m, N_OUT + 10, generator=g).to(dtype)
    slots = rows(m, seed=m)
    slots[: min(m, 2)] = torch.tensor([first_slot, -1])[: min(m, 2)].to(torch.int32)
    return a, b, x, wide, slots


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("m", "case"),
    [(m, case) for m in (1, 3, 64, 300) for case in CASES if m <= 3 or case != "in_2200_many_splits"],
)
def test_triton_equals_the_reference(interpreter, m, case, dtype):
    a, b, x, wide, slots = case_operands(m, case, dtype)
    expected, ours = wide.clone(), wide.clone()
    add_lora(expected[:, 5 : 5 + N_OUT], x, a, b, slots)
    add_lora(ours[:, 5 : 5 + N_OUT], x, a, b, slots, backend="triton")
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ours, expected, **tol)
    base = slots < 0
    assert torch.equal(ours[base], wide[base]) and torch.equal(ours[:, :5], wide[:, :5])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 32, 300, 2048])
def test_triton_on_the_gpu_in_a_cuda_graph(m):
    """bf16 on the device, captured once and replayed with other slots written into the graph's input."""
    a, b = (w.cuda() for w in pool_weights(torch.bfloat16, ranks=(8, 16, 64), max_rank=64))
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, N_IN, generator=g).to(torch.bfloat16).cuda()
    wide = torch.randn(m, N_OUT + 10, generator=g).to(torch.bfloat16).cuda()
    slots, y = rows(m, seed=m).cuda(), wide.clone()
    add_lora(y[:, 5 : 5 + N_OUT], x, a, b, slots, backend="triton")  # (compiles outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_lora(y[:, 5 : 5 + N_OUT], x, a, b, slots, backend="triton")
    for seed in (7, 8):
        slots.copy_(rows(m, seed=seed).cuda())
        y.copy_(wide)
        graph.replay()
        expected = wide.clone()
        add_lora(expected[:, 5 : 5 + N_OUT], x, a, b, slots)
        torch.testing.assert_close(y, expected, rtol=1e-2, atol=1e-2)
        assert torch.equal(y[slots < 0], wide[slots < 0])


def all_slots_shrink(x, a):
    """Every slot's shrink of every row, [M, S * R], rounded to the weights' dtype (what the projection's
    GEMV gives with the pool's A rows as more weight rows)."""
    return (x.float() @ a.reshape(-1, a.shape[-1]).float().T).to(a.dtype)


@CPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 3, 32])
@pytest.mark.parametrize("case", ["ranks_8_16_4_of_16", "ranks_8_16_64_of_64"])
@pytest.mark.parametrize("splits", [1, 3])  # 3: the GEMV's fp32 split-K partial sums [M, 3, S * R]
def test_expand_of_every_slots_shrink_equals_the_reference(interpreter, m, case, dtype, splits):
    from omniwalk.kernels.lora import expand_lora_triton

    a, b, x, wide, slots = case_operands(m, case, dtype, first_slot=2)
    max_rank = a.shape[1]
    t = all_slots_shrink(x, a)
    if splits > 1:  # (parts that sum to the shrink in fp32)
        parts = torch.randn(m, splits - 1, t.shape[1], generator=torch.Generator().manual_seed(splits))
        t = torch.cat([t.float()[:, None] - parts.sum(1, keepdim=True), parts], dim=1)
    expected, ours = wide.clone(), wide.clone()
    add_lora(expected[:, 5 : 5 + N_OUT], x, a, b, slots)
    expand_lora_triton(ours[:, 5 : 5 + N_OUT], t, b, slots)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ours, expected, **tol)
    base = slots < 0
    assert torch.equal(ours[base], wide[base]) and torch.equal(ours[:, :5], wide[:, :5])
    if m == 32 and dtype == torch.float32 and splits == 1:  # a wrong slot's values would not pass
        shifted = wide.clone()
        expand_lora_triton(shifted[:, 5 : 5 + N_OUT], t.roll(max_rank, dims=1), b, slots)
        assert not torch.allclose(shifted, expected, **tol)
