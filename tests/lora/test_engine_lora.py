"""The adapter pool in the engine (Qwen3-Omni tiny, the CPU's reference path): six adapters through two
slots under 32 concurrent requests, each answered with its own adapter's ids; unloading an adapter in use;
prefix pages keyed by adapter; typed errors."""

import pytest
from helpers import qwen3_omni
from helpers.hf_oracle import AdapterSpec, peft_model

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
