"""The fused sampling kernels in Triton's CPU interpreter against ``sampling.draw_reference``.

Run by ``test_sampling_kernels.py`` in a subprocess with TRITON_INTERPRET=1 set before triton is
imported (triton's own jit library, ``tl.sort``/``tl.topk``, is defined at its import). Small
vocabularies (the interpreter runs a sort's steps in Python); 5000 takes the split
large-vocabulary path. ``test_sampling_gpu.py`` runs the compiled kernels at full size.
"""

import os

import pytest
import torch
from helpers.triton_cpu import random_bitmask, random_logits, random_states, unexplained_rows

from omniwalk.kernels import sampling as sampling_kernels
from omniwalk.sampling import BatchParams, draw_fused, draw_reference, gumbel_noise

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by test_sampling_kernels.py with TRITON_INTERPRET=1", allow_module_level=True)


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
def test_kernel_ids_equal_the_reference(vocab, dtype, graph, step_offset):
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


@pytest.mark.parametrize("sampled", [False, True])
def test_ties_rank_by_index(sampled):
    """Equal scores rank by index (the reference's stable sort; -0.0 equals +0.0): a top-k cut
    through a tie keeps the first ids, and argmax takes the first."""
    cases = [([1.0, 5.0, 5.0, 2.0, 5.0], 2, {1, 2}), ([-0.0, 0.0, -1.0, -2.0], 1, {0}), ([3.0] * 6, 3, {0, 1, 2})]
    for values, top_k, allowed in cases:
        logits = torch.tensor([values])
        for seed in range(6):
            p = _one_row(logits, top_k, sampled, seed)
            ids = draw_fused(logits, p)
            assert ids.tolist() == draw_reference(logits, p).tolist() and ids.item() in allowed


def test_kernel_noise_is_the_reference_hash():
    """Same hash bits; the interpreter's numpy log may differ from torch's in the last bit."""
    seeds, steps = torch.tensor([0, 1, -(2**62), 2**62 + 5]), torch.tensor([0, 6933, 7, 2**40])
    ours, ref = sampling_kernels.gumbel_noise(seeds, steps, 3000), gumbel_noise(seeds, steps, 3000)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-6)
