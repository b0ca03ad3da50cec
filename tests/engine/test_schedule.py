"""The scheduling policy for flat TTFT: a per-step token budget sized to the device, prefill chunks
and decodes in every step, arrivals admitted in the step after they arrive."""

import pytest
from helpers.toy_lm import make_engine, make_request

from omniwalk.config import EngineConfig, ModelConfig, OmniConfig, resolve_auto
from omniwalk.errors import ConfigError


def test_token_budget_is_sized_to_the_device_once():
    cpu, cuda = OmniConfig.from_kwargs(model="m"), OmniConfig.from_kwargs(model="m", device="cuda")
    assert (cpu.engine.max_batch_tokens, cuda.engine.max_batch_tokens) == (512, 1024)
    given = OmniConfig.from_kwargs(model="m", device="cuda", max_batch_tokens=100)
    assert given.engine.max_batch_tokens == 100
    assert EngineConfig().max_batch_tokens == 0  # unresolved until a device is known
    assert resolve_auto(OmniConfig(ModelConfig(model="m"))).engine.max_batch_tokens == 512
    with pytest.raises(ConfigError, match="max_batch_tokens must be >= 0"):
        EngineConfig(max_batch_tokens=-1)


def test_a_burst_of_arrivals_is_admitted_at_once_beside_running_decodes():
    """Four requests decode; eight arrive together. With a budget that holds their prompts, every
    arrival runs its whole prefill in the next step, and the decodes keep one token per step."""
    engine, stage = make_engine(max_batch_tokens=4 + 8 * 20)
    running = [make_request(f"d{i}", 3, 40, i) for i in range(4)]
    for req in running:
        engine.add(req)
    for _ in range(3):
        engine.step()
    burst = [make_request(f"a{i}", 20, 5, 10 + i) for i in range(8)]
    for req in burst:
        engine.add(req)
    before = [len(r.state["seq"]) for r in running]
    engine.step()
    assert all(r in stage.running and stage.tables[r.id].num_cached == 20 for r in burst)
    assert [len(r.state["seq"]) for r in running] == [n + 1 for n in before]


def test_a_burst_larger_than_the_budget_is_chunked_fifo():
    """Arrivals beyond the budget wait FIFO and are cut into chunks of what is left: the oldest
    arrival's prefill is never behind a younger one's."""
    engine, stage = make_engine(max_batch_tokens=48)
    burst = [make_request(f"a{i}", 30, 5, i) for i in range(4)]
    for req in burst:
        engine.add(req)
    engine.step()
    cached = [stage.tables[r.id].num_cached for r in burst]
    assert cached == [30, 18, 0, 0]
    engine.step()
    cached = [stage.tables[r.id].num_cached for r in burst]
    assert cached[:2] == [31, 30] and cached[2] > 0
