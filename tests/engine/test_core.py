"""The generic engine (KV stage scheduling, preemption, abort, failure isolation) on a toy model.

The toy is a real one-layer attention LM whose keys/values live in the paged KV, so a scheduling
or paging bug changes its greedy tokens.

The scheduling policy for flat TTFT: a per-step token budget sized to the device, prefill chunks
and decodes in every step, arrivals admitted in the step after they arrive."""

import numpy as np
import pytest
import torch
from helpers.toy_lm import (
    DIM,
    HEADS,
    ToyLM,
    ToyProgram,
    drive,
    generated,
    make_engine,
    make_request,
    run_alone,
    workload,
)

from omniwalk.config import EngineConfig, ModelConfig, OmniConfig, resolve_auto
from omniwalk.engine.engine import Engine, QueueFullError
from omniwalk.engine.kv_pages import KVStorage, PagePool
from omniwalk.engine.kv_stage import KVStage, KVStageConfig
from omniwalk.engine.request import Status
from omniwalk.errors import ConfigError


def test_batched_staggered_equals_alone():
    engine, stage = make_engine()
    reqs = drive(engine, workload())
    for rid, p, m, s in workload():
        assert generated(reqs[rid]) == run_alone(p, m, s), rid
        assert reqs[rid].status is Status.FINISHED
    assert stage.pool.num_used == 0


def test_kv_pressure_preempts_and_still_matches():
    engine, stage = make_engine(num_pages=20)  # 80 tokens for a workload of ~400
    reqs = drive(engine, workload(), stagger=1)
    assert stage.num_preemptions > 0
    for rid, p, m, s in workload():
        assert generated(reqs[rid]) == run_alone(p, m, s), rid
    assert stage.pool.num_used == 0


def test_abort_frees_pages_and_leaves_others_unchanged():
    engine, stage = make_engine()
    aborted = {"r1", "r4", "r7", "r10"}

    def abort_some(step, reqs):
        for rid in aborted:
            if rid in reqs and step >= 3 + int(rid[1:]):
                engine.abort(rid)

    reqs = drive(engine, workload(), on_step=abort_some)
    for rid, p, m, s in workload():
        if rid in aborted:
            assert reqs[rid].status is Status.ABORTED
        else:
            assert generated(reqs[rid]) == run_alone(p, m, s)
    assert stage.pool.num_used == 0 and not stage.running and not stage.waiting and not stage.tables


def test_injected_failure_fails_only_that_request():
    engine, stage = make_engine(fail_on={"r3"})
    reqs = drive(engine, workload())
    assert reqs["r3"].status is Status.FAILED
    assert isinstance(reqs["r3"].events[-1].data, RuntimeError)
    for rid, p, m, s in workload():
        if rid != "r3":
            assert reqs[rid].status is Status.FINISHED
            assert generated(reqs[rid]) == run_alone(p, m, s)
    assert stage.pool.num_used == 0


def test_bounded_admission():
    engine, _ = make_engine(max_requests=2)
    engine.add(make_request("a", 3, 2, 0))
    engine.add(make_request("b", 3, 2, 1))
    with pytest.raises(QueueFullError):
        engine.add(make_request("c", 3, 2, 2))


def test_long_prompt_is_chunked_and_does_not_stall_decodes():
    engine, stage = make_engine(max_batch_tokens=16)
    short = make_request("short", 2, 30, 0)
    engine.add(short)
    engine.step()  # prefill of the short one
    engine.add(make_request("long", 200, 1, 1))
    produced = []
    for _ in range(10):
        before = len(generated(short))
        engine.step()
        produced.append(len(generated(short)) - before)
    assert all(p == 1 for p in produced)  # the decode ran every step while the long prompt prefilled


class SplittingProgram(ToyProgram):
    """Claims a (pretend) captured graph for one-token decode rows, and records every forward."""

    def __init__(self, model, fail_on=frozenset(), bound=0):
        super().__init__(model, fail_on)
        self.forwards, self.bound = [], bound

    def graph_rows(self, batch):
        return [n == 1 and start == len(req.state["seq"]) - 1 for req, start, n in batch]

    def graph_batch(self):
        return self.bound

    def run(self, batch, kv):
        self.forwards.append(self.graph_rows(batch))
        super().run(batch, kv)


def test_decode_rows_run_apart_from_prefill_chunks_and_still_match():
    """A program with graphs gets pure-decode rows as their own forward when prefill chunks share
    the step; outputs stay those of each request alone, and failures stay isolated per forward."""
    storage = KVStorage(PagePool(256, 4), 1, HEADS, DIM // HEADS, torch.float32, "cpu")
    program = SplittingProgram(ToyLM(), fail_on={"r5"})
    stage = KVStage("lm", program, storage, KVStageConfig(64, 64), "cpu")
    engine = Engine([stage])
    reqs = drive(engine, workload())
    assert all(all(f) or not any(f) for f in program.forwards)  # no decode row rode along with a prefill
    assert any(all(f) and len(f) > 1 for f in program.forwards)
    for rid, p, m, s in workload():
        if rid == "r5":
            assert reqs[rid].status is Status.FAILED
        else:
            assert generated(reqs[rid]) == run_alone(p, m, s), rid
    assert stage.pool.num_used == 0


def test_decode_rows_past_the_largest_graph_run_in_even_pieces():
    """More decode rows than the (pretend) graph's largest bucket: the stage runs them as pieces of
    at most that many rows, within one row of each other, and outputs stay each request's alone."""
    storage = KVStorage(PagePool(256, 4), 1, HEADS, DIM // HEADS, torch.float32, "cpu")
    program = SplittingProgram(ToyLM(), bound=3)
    stage = KVStage("lm", program, storage, KVStageConfig(64, 64), "cpu")
    reqs = drive(Engine([stage]), workload())
    graphed = [len(f) for f in program.forwards if all(f)]
    assert max(graphed) == 3 and graphed.count(2) > 0  # (e.g. 4 rows as 2 + 2, never 3 + 1)
    for rid, p, m, s in workload():
        assert generated(reqs[rid]) == run_alone(p, m, s), rid
    assert stage.pool.num_used == 0


def test_even_pieces_are_fewest_and_within_one_row():
    from omniwalk.engine.cuda_graphs import even_pieces

    assert [len(p) for p in even_pieces(list(range(80)), 64)] == [40, 40]
    assert [len(p) for p in even_pieces(list(range(7)), 3)] == [2, 2, 3]
    assert even_pieces(list(range(5)), 0) == [list(range(5))] and even_pieces([], 4) == []
    assert sum(even_pieces(list(range(65)), 32), []) == list(range(65))  # every item once, in order


def test_graph_inputs_copy_live_rows_and_pad_the_rest():
    """What a CUDA graph replay reads: live rows copied in (narrower tables too), every row after
    them reset to its pad value even when an earlier, larger batch left real values there."""
    from omniwalk.engine.cuda_graphs import StaticInput, fill_static

    specs = {"slots": StaticInput((), torch.long, pad=99), "table": StaticInput((6,), torch.int32)}
    static = {name: torch.full((4, *s.shape), s.pad, dtype=s.dtype) for name, s in specs.items()}
    fill_static(static, specs, {"slots": torch.tensor([1, 2, 3, 4]), "table": torch.ones(4, 6, dtype=torch.int32)}, 4)
    fill_static(static, specs, {"slots": torch.tensor([7, 8]), "table": torch.tensor([[5, 6], [7, 8]]).int()}, 2)
    assert static["slots"].tolist() == [7, 8, 99, 99]
    assert static["table"][:2, :2].tolist() == [[5, 6], [7, 8]] and static["table"][2:].eq(0).all()


def test_small_graph_inputs_go_up_from_the_host_in_one_buffer():
    """A decode graph's small inputs (``PackedInputs``) are views of one buffer, 16-byte aligned;
    an upload writes the host rows (narrower ones in their leading columns) and pads every other
    row and every input not given, so a smaller batch after a larger one leaves nothing behind."""
    from omniwalk.engine.cuda_graphs import PackedInputs, StaticInput

    specs = {
        "ids": StaticInput((), torch.long),
        "positions": StaticInput((3,), torch.float32, pad=-1.0),
        "lens": StaticInput((), torch.int32, pad=7),
        "flags": StaticInput((2,), torch.bool),
    }
    packed = PackedInputs(specs, 4, "cpu")
    base, end = packed.buffer.data_ptr(), packed.buffer.data_ptr() + packed.buffer.numel()
    for name, view in packed.views.items():
        assert base <= view.data_ptr() < end and (view.data_ptr() - base) % 16 == 0, name
    rows = {"ids": np.array([5, 6, 7]), "positions": torch.arange(9.0).view(3, 3).T.T, "flags": np.ones((3, 1), bool)}
    packed.upload(rows, 3)
    packed.upload({"ids": np.array([8]), "positions": torch.tensor([[1.0, 2.0, 3.0]]), "flags": np.array([[True]])}, 1)
    v = packed.views
    assert v["ids"].tolist() == [8, 0, 0, 0] and v["lens"].tolist() == [7, 7, 7, 7]
    assert v["positions"].tolist() == [[1.0, 2.0, 3.0]] + [[-1.0] * 3] * 3
    assert v["flags"].tolist() == [[True, False]] + [[False, False]] * 3


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
