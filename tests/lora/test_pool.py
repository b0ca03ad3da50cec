"""The adapter pool: 6 adapters through 2 slots under many acquire/release orders. A slot never holds two
live adapters, only idle adapters are evicted (least recently used first), acquire answers None when every
slot is held, the counters count, the slot tensors are never reallocated and hold exactly the adapter's
weights zero-padded to the pool's rank."""

import random

import pytest
import torch

from omniwalk.lora.adapters import Adapter, AdapterError, Target
from omniwalk.lora.ops import add_lora
from omniwalk.lora.pool import MERGED, AdapterPool

TARGETS = {
    (layer, module): Target(layer=layer, module=module, in_features=i, out_features=o)
    for layer in range(2)
    for module, (i, o) in {"q_proj": (12, 16), "o_proj": (16, 12), "down_proj": (20, 12)}.items()
}
MAX_RANK = 8


def make_adapter(name: str, rank: int, seed: int, skip=()) -> Adapter:
    g = torch.Generator().manual_seed(seed)
    weights = {
        key: (torch.randn(rank, t.in_features, generator=g), torch.randn(t.out_features, rank, generator=g))
        for key, t in TARGETS.items()
        if key not in skip
    }
    return Adapter(name=name, path=f"/adapters/{name}", rank=rank, weights=weights)


ADAPTERS = [
    make_adapter(f"ad{i}", rank=(2, 4, 8)[i % 3], seed=i, skip=[(1, "q_proj")] if i == 4 else ()) for i in range(6)
]


def new_pool(slots: int = 2) -> AdapterPool:
    pool = AdapterPool(TARGETS, slots=slots, max_rank=MAX_RANK, device="cpu", dtype=torch.float32)
    for adapter in ADAPTERS:
        pool.register(adapter)
    return pool


def assert_slot_holds(pool: AdapterPool, slot: int, adapter: Adapter):
    for key in TARGETS:
        a, b = pool.a[key][slot], pool.b[key][slot]
        wa, wb = adapter.weights.get(key, (torch.zeros(0, a.shape[1]), torch.zeros(b.shape[0], 0)))
        r = wa.shape[0]
        assert torch.equal(a[:r], wa) and torch.equal(b[:, :r], wb)
        assert not a[r:].any() and not b[:, r:].any()  # zero padding: the extra ranks add nothing


@pytest.mark.parametrize("seed", range(8))
def test_random_acquire_release_orders(seed):
    rng = random.Random(seed)
    pool = new_pool()
    pointers = {key: (pool.a[key].data_ptr(), pool.b[key].data_ptr()) for key in TARGETS}
    held: list[str] = []  # one entry per live request
    resident: dict[int, str] = {}  # slot -> adapter whose weights it holds
    last_idle: dict[str, int] = {}  # adapter -> the step it became idle
    loads = hits = waits = evictions = 0
    for step in range(400):
        if held and rng.random() < 0.45:
            name = held.pop(rng.randrange(len(held)))
            pool.release(name)
            if name not in held:
                last_idle[name] = step
            continue
        name = rng.choice(ADAPTERS).name
        live = set(held)
        slot = pool.acquire(name)
        if name in resident.values():
            hits += 1
            assert slot == next(s for s, n in resident.items() if n == name)
        elif len({resident.get(s) for s in range(2)} & live) == 2:
            waits += 1
            assert slot is None  # every slot held by another adapter's requests: the caller waits
            continue
        else:
            free = [s for s in range(2) if s not in resident]
            idle = sorted((s for s in resident if resident[s] not in live), key=lambda s: last_idle[resident[s]])
            expected = free[0] if free else idle[0]  # a free slot first, else the least recently used idle one
            assert slot == expected
            evictions += expected in resident
            resident[expected] = name
            loads += 1
        held.append(name)
        assert_slot_holds(pool, slot, ADAPTERS[int(name[2:])])
        assert len({n for n in held if pool.slot_of(n) == slot}) == 1  # one live adapter per slot
    assert (pool.stats.loads, pool.stats.hits, pool.stats.waits, pool.stats.evictions) == (
        loads,
        hits,
        waits,
        evictions,
    )
    assert pool.stats.swaps == evictions and evictions > 10 and waits > 10
    assert {key: (pool.a[key].data_ptr(), pool.b[key].data_ptr()) for key in TARGETS} == pointers


def test_unregistering_an_adapter_in_use_lets_its_requests_finish():
    pool = new_pool()
    slot = pool.acquire("ad1")
    assert pool.acquire("ad1") == slot
    pool.unregister("ad1")
    assert "ad1" not in pool.names() and pool.slot_of("ad1") == slot
    with pytest.raises(AdapterError, match="'ad1' is not loaded"):
        pool.acquire("ad1")
    with pytest.raises(AdapterError, match="requests still use it"):
        pool.register(ADAPTERS[1])
    assert_slot_holds(pool, slot, ADAPTERS[1])  # its requests still read its weights
    pool.release("ad1")
    pool.release("ad1")
    assert pool.slot_of("ad1") is None
    assert pool.acquire("ad2") == slot  # the freed slot first, then the never used one: no eviction
    assert pool.acquire("ad0") == 1 - slot
    assert pool.stats.evictions == 0 and pool.acquire("ad3") is None
    pool.register(ADAPTERS[1])
    assert pool.names() == ["ad0", "ad2", "ad3", "ad4", "ad5", "ad1"]


def test_registration_refusals():
    pool = new_pool()
    with pytest.raises(AdapterError, match="'ad0' is already loaded"):
        pool.register(ADAPTERS[0])
    with pytest.raises(AdapterError, match="rank 16, above the maximum 8"):
        pool.register(make_adapter("big", rank=16, seed=9))
    stranger = Adapter(name="s", path="/s", rank=2, weights={(7, "q_proj"): ADAPTERS[0].weights[(0, "q_proj")]})
    with pytest.raises(AdapterError, match=r"\(7, 'q_proj'\)"):
        pool.register(stranger)
    with pytest.raises(AdapterError, match="'nope' is not loaded"):
        pool.acquire("nope")
    with pytest.raises(ValueError, match="released more often"):
        pool.release("ad0")


def test_merged_projections_add_what_their_members_add():
    """q/k/v (and gate/up) held merged: one add_lora on the merged output equals each member's on its slice."""
    targets = {
        (layer, module): Target(layer=layer, module=module, in_features=i, out_features=o)
        for layer in range(2)
        for module, (i, o) in {"q_proj": (12, 16), "k_proj": (12, 8), "v_proj": (12, 8), "o_proj": (16, 12)}.items()
    }
    g = torch.Generator().manual_seed(4)
    adapters = [
        Adapter(
            name=f"m{i}",
            path="/m",
            rank=r,
            weights={
                k: (torch.randn(r, t.in_features, generator=g), torch.randn(t.out_features, r, generator=g))
                for k, t in targets.items()
                if k != (0, "k_proj") or i == 0
            },
        )
        for i, r in enumerate((4, 8))
    ]
    merged = AdapterPool(targets, slots=2, max_rank=8, device="cpu", dtype=torch.float32, merged=MERGED)
    apart = AdapterPool(targets, slots=2, max_rank=8, device="cpu", dtype=torch.float32)
    assert set(merged.a) == {(0, "qkv_proj"), (1, "qkv_proj"), (0, "o_proj"), (1, "o_proj")}
    assert merged.a[(0, "qkv_proj")].shape == (2, 24, 12) and merged.b[(0, "qkv_proj")].shape == (2, 32, 24)
    for pool in (merged, apart):
        for adapter in adapters:
            pool.register(adapter)
        assert [pool.acquire("m1"), pool.acquire("m0")] == [0, 1]
    slots = torch.tensor([1, -1, 0, 0, 1], dtype=torch.int32)
    x = torch.randn(5, 12, generator=g)
    for layer in range(2):
        ours, expected = torch.zeros(5, 32), torch.zeros(5, 32)
        add_lora(ours, x, merged.a[(layer, "qkv_proj")], merged.b[(layer, "qkv_proj")], slots)
        for module, start, width in (("q_proj", 0, 16), ("k_proj", 16, 8), ("v_proj", 24, 8)):
            add_lora(expected[:, start : start + width], x, apart.a[(layer, module)], apart.b[(layer, module)], slots)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
        assert ours[0].abs().min() > 0 and not ours[1].any()  # (row 1: the base model)
        assert ours[2:4, 16:24].any() == (layer == 1)  # slot 0's m1 adapts k_proj in layer 1 alone
