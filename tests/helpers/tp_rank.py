"""One rank of the tensor-parallel logits test (``test_tensor_parallel.py``), run as a script:

    python tests/helpers/tp_rank.py RANK WORLD STORE CKPT OUT

Loads the thinker, keeps this rank's share (``shard_decoder``; none with WORLD 1), runs a prompt and
greedy decode steps over a contiguous KV cache, and (rank 0) saves every step's logits to OUT.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the helpers package
from helpers.single_request import ContiguousKVCache  # noqa: E402

from omniwalk.models.qwen3_omni.checkpoint.loader import load_components  # noqa: E402
from omniwalk.parallel.layers import local_heads, shard_decoder  # noqa: E402

PROMPT, STEPS = 23, 12


@torch.inference_mode()
def thinker_logits(rank: int, world: int, ckpt: str) -> torch.Tensor:
    """[PROMPT + STEPS - 1, vocab]: the prompt's logits, then each greedy decode step's."""
    transform = (lambda name, module: shard_decoder(module, rank, world)) if world > 1 else None
    thinker = load_components(ckpt, ("thinker",), transform=transform)["thinker"]
    cache = ContiguousKVCache.for_config(local_heads(thinker.cfg, world), torch.float32, "cpu")
    ids = (torch.arange(PROMPT) * 7919 + 11) % thinker.cfg.vocab_size
    rows = [thinker(ids, torch.arange(PROMPT), cache, all_logits=True).logits]
    for step in range(STEPS - 1):
        token = rows[-1][-1:].argmax(-1)
        rows.append(thinker(token, torch.tensor([PROMPT + step]), cache, all_logits=True).logits)
    return torch.cat(rows)


if __name__ == "__main__":
    rank, world, store, ckpt, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    logits = thinker_logits(rank, world, ckpt)
    if rank == 0:
        torch.save(logits, out)
    dist.destroy_process_group()
