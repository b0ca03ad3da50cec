"""The adapter pool in the engine. On the CPU (Qwen3-Omni tiny, the reference path): six adapters through
two slots under 32 concurrent requests, each answered with its own adapter's ids; unloading an adapter in
use; prefix pages keyed by adapter; typed errors.

On the GPU fast path (``gpu``; tiny models, bf16, the Triton LoRA kernels): the rows' adapter slots go into
the decode and prefill graphs, q/k/v adapters add to column slices of the merged projection and
Qwen2.5-Omni's dense gate/up/down to the plain merged product. Graphs on against graphs off on a batch
mixing the base and three adapters of both families: ids equal except at a near tie of the eager run, and
every adapter's answer differs from the base's (a graph that ignored the slots would give the base's)."""

import pytest
from helpers import qwen2_5_omni, qwen3_omni
from helpers.hf_oracle import ATTENTION, DENSE_MLP, AdapterSpec, peft_model

from omniwalk import Omni
from omniwalk.errors import InvalidRequestError
from omniwalk.lora.adapters import AdapterError

NAMES = [f"a{i}" for i in range(6)]
SYSTEM = "You answer questions about the weather in short sentences. " * 6  # a few full KV pages


@pytest.fixture(scope="module")
def paths() -> dict:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_omni.checkpoint("tiny"))
    return peft_model(hf, {name: AdapterSpec(8, 16) for name in NAMES}, seed=11)[1]


@pytest.fixture(scope="module")
def omni(paths) -> Omni:
    loras = tuple(f"{name}={path}" for name, path in paths.items())
    return Omni(model=qwen3_omni.checkpoint("tiny"), max_loras=2, max_lora_rank=8, loras=loras)


def request(lora: str | None, n: int = 6, system: bool = False) -> dict:
    messages = [{"role": "system", "content": SYSTEM}] * system + qwen3_omni.MESSAGES
    return {"messages": messages, "max_tokens": n, "min_tokens": n, "temperature": 0.0, "lora": lora}


@pytest.fixture(scope="module")
def alone(omni) -> dict:
    return {name: omni.generate(request(name)).token_ids for name in [None, *NAMES]}


def thinker_stats(omni: Omni) -> dict:
    return omni.engine.stats()["thinker"]


def test_six_adapters_through_two_slots_serve_32_concurrent_requests(omni, alone):
    assert len(set(map(tuple, alone.values()))) == 7  # every adapter answers differently
    before = thinker_stats(omni)
    loras = [([None, *NAMES])[i % 7] for i in range(32)]
    outs = omni.generate([request(lora) for lora in loras])
    for lora, out in zip(loras, outs, strict=True):
        assert out.finish_reason == "length" and out.error is None
        assert out.token_ids == alone[lora], lora
    after = thinker_stats(omni)
    assert after["lora_swaps"] - before["lora_swaps"] >= 4  # six adapters went through two slots
    assert after["lora_waits"] > before["lora_waits"]  # requests waited for a slot instead of failing
    assert after["running"] == after["waiting"] == 0


def test_unloading_an_adapter_in_use_lets_its_requests_finish(omni, alone, paths):
    req = omni.add(request("a1"))
    while not req.state.thinker.generated:
        omni.step()
    omni.unload_adapter("a1")
    assert "a1" not in omni.adapters
    with pytest.raises(InvalidRequestError, match="unknown adapter 'a1'") as refused:
        omni.add(request("a1"))
    assert refused.value.param == "lora"
    with pytest.raises(AdapterError, match="requests still use it"):
        omni.load_adapter("a1", str(paths["a1"]))
    while not req.status.is_done:
        omni.step()
    assert omni.output(req).token_ids == alone["a1"]
    omni.load_adapter("a1", str(paths["a1"]))  # its last request gone: the name is free again
    assert omni.generate(request("a1")).token_ids == alone["a1"]


def test_prefix_pages_are_keyed_by_adapter(omni):
    def prefix_tokens() -> int:
        return thinker_stats(omni)["prefix_tokens"]

    base = omni.generate(request(None, system=True))
    start = prefix_tokens()
    first = omni.generate(request("a2", system=True))
    assert prefix_tokens() == start  # the base's pages are not the adapter's
    again = omni.generate(request("a2", system=True))
    assert prefix_tokens() > start  # the adapter's own pages are
    assert again.token_ids == first.token_ids != base.token_ids


def test_an_unknown_adapter_or_a_bad_name_is_a_typed_error(omni, paths):
    with pytest.raises(InvalidRequestError, match="unknown adapter 'nope'"):
        omni.generate(request("nope"))
    with pytest.raises(AdapterError, match="already loaded"):
        omni.load_adapter("a0", str(paths["a0"]))
    with pytest.raises(AdapterError, match="adapter name"):
        omni.load_adapter("bad name", str(paths["a0"]))
    with pytest.raises(AdapterError, match="not loaded"):
        omni.unload_adapter("nope")


def test_aborted_and_failed_requests_give_their_slots_back(omni, alone):
    held = [omni.add(request(name, n=64)) for name in ("a3", "a4")]
    while not all(r.state.thinker.lora_slot >= 0 for r in held):
        omni.step()
    blocked = omni.add(request("a5"))
    omni.step()
    assert blocked.state.thinker.lora_slot < 0  # both slots held: it waits
    omni.abort(held[0].id)
    held[1].fail(RuntimeError("injected"))
    while not blocked.status.is_done:
        omni.step()
    omni.engine.drain()
    assert omni.output(blocked).token_ids == alone["a5"]
    adapters = omni.family.adapters
    assert not any(adapters.users.values()) and not any(adapters.pool._refs.values())


BATCH_LORAS = [None, "r8", "r16", "r64"]  # (the base and three adapters)


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


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("family", ["qwen3", "qwen2_5"])
def test_adapters_in_graphs_equal_eager(family):
    helper, paths = _adapters(family)
    loras = tuple(f"{name}={path}" for name, path in paths.items())

    def omni(graphs: int, prefill: int) -> Omni:
        options = {"cuda_graph_max_batch": graphs, "prefill_graph_max_tokens": prefill, "max_lora_rank": 64}
        options["prefix_cache"] = False  # (every prompt computed whole: the step's layout fits a prefill graph)
        return Omni(model=helper.checkpoint("tiny"), device="cuda", dtype="bfloat16", loras=loras, **options)

    requests = [_request(helper, BATCH_LORAS[i % 4], i // 4) for i in range(12)]
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
