"""LoRA adapters on the GPU fast path (tiny models, bf16, the Triton LoRA kernels): the rows' adapter slots
go into the decode and prefill graphs, q/k/v adapters add to column slices of the merged projection and
Qwen2.5-Omni's dense gate/up/down to the plain merged product. Graphs on against graphs off on a batch
mixing the base and three adapters of both families: ids equal except at a near tie of the eager run, and
every adapter's answer differs from the base's (a graph that ignored the slots would give the base's)."""

import pytest
from helpers import qwen2_5_omni, qwen3_omni
from helpers.hf_oracle import ATTENTION, DENSE_MLP, AdapterSpec, peft_model

from omniwalk import Omni

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning")]

NAMES = [None, "r8", "r16", "r64"]


def _adapters(family: str) -> tuple:
    if family == "qwen3":
        from transformers import Qwen3OmniMoeForConditionalGeneration as Model

        helper, modules = qwen3_omni, ATTENTION
    else:
        from transformers import Qwen2_5OmniForConditionalGeneration as Model

        helper, modules = qwen2_5_omni, ATTENTION + DENSE_MLP
    specs = {"r8": AdapterSpec(8, 16, modules), "r16": AdapterSpec(16, 8, modules), "r64": AdapterSpec(64, 32, modules)}
    hf = Model.from_pretrained(helper.checkpoint("tiny"))
    return helper, peft_model(hf, specs, seed=5)[1]


def _request(helper, lora, i: int) -> dict:
    messages = [{"role": "user", "content": f"request {i}: tell me about the weather"}, *helper.MESSAGES]
    n, greedy = 24, {"temperature": 0.0, "logprobs": True, "top_logprobs": 2}
    return {"messages": messages, "max_tokens": n, "min_tokens": n, "lora": lora, **greedy}


@pytest.mark.parametrize("family", ["qwen3", "qwen2_5"])
def test_adapters_in_graphs_equal_eager(family):
    helper, paths = _adapters(family)
    loras = tuple(f"{name}={path}" for name, path in paths.items())

    def omni(graphs: int, prefill: int) -> Omni:
        options = {"cuda_graph_max_batch": graphs, "prefill_graph_max_tokens": prefill, "max_lora_rank": 64}
        options["prefix_cache"] = False  # (every prompt computed whole: the step's layout fits a prefill graph)
        return Omni(model=helper.checkpoint("tiny"), device="cuda", dtype="bfloat16", loras=loras, **options)

    requests = [_request(helper, NAMES[i % 4], i // 4) for i in range(12)]
    eager, graphed = omni(0, 0).generate(requests), omni(16, 1024)
    outs = graphed.generate(requests)
    stats = graphed.engine.stats()["thinker"]
    print(f"GPU-LORA {family} thinker stats {stats}")
    assert stats["graph_replays"] > 0 and stats["prefill_graph_replays"] > 0
    for i, (x, y) in enumerate(zip(eager, outs, strict=True)):
        assert x.error is None and y.error is None
        if x.token_ids != y.token_ids:
            k = next(j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=True)) if s != t)
            gap = x.logprobs[k].top[0][1] - x.logprobs[k].top[1][1] if len(x.logprobs[k].top) > 1 else 0.0
            print(f"GPU-LORA {family} request {i}: ids differ first at {k}; eager top-2 gap {gap:.4f}")
            assert gap < 0.05
    for i in range(0, 12, 4):  # same prompt: base, r8, r16, r64
        base = outs[i].token_ids
        assert all(outs[i + j].token_ids != base for j in (1, 2, 3)), i
