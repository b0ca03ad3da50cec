"""Qwen2.5-Omni's graphs on the CPU: the thinker's decode graph (which now also runs speech requests'
rows, returning their last hidden states and input embeddings), the talker's (projection, talker
decode, codec head), and both stages' prefill layers over padded layouts, each replayed by a stand-in
that keeps the graphs' contract without CUDA (static buffers per bucket, padding rows). A staggered
mixed workload through the graph paths equals each request alone on the eager path (ids, codes; audio
to rounding), and the talker's input rows equal the eager run's to GEMM rounding. Real CUDA graphs
against eager: ``test_graphs_gpu.py``."""

import pytest
import torch
from helpers.qwen2_5_omni import alone, assert_free, assert_same, checkpoint, make_request, walk_omni, workload
from helpers.qwen3_omni import run_staggered
from helpers.replay import EagerReplay, ReplayOnCPU

from omniwalk import Omni
from omniwalk.engine import prefill_graphs
from omniwalk.engine.prefill_graphs import PrefillPlan
from omniwalk.engine.request import Chunk
from omniwalk.models.common.programs import thinker_program
from omniwalk.models.qwen2_5_omni.programs import talker_program

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def graphed(monkeypatch, max_batch: int = 4) -> Omni:
    """A tiny Qwen2.5-Omni whose thinker and talker decode steps replay (stand-in) graphs of up to
    ``max_batch`` rows, and whose prefill steps of up to 256 tokens replay (stand-in) graphs of their
    padded layouts (off CUDA the config turns graphs off, so they are switched on here)."""
    monkeypatch.setattr(thinker_program, "GraphedStep", ReplayOnCPU)
    monkeypatch.setattr(talker_program, "GraphedStep", ReplayOnCPU)
    monkeypatch.setattr(prefill_graphs, "KeyedGraphs", EagerReplay)
    o = Omni(model=checkpoint("tiny"))
    for name in ("thinker", "talker"):
        stage = o.engine.stages[name]
        stage.program.graph_max_batch = max_batch
        stage.program.prefill = PrefillPlan(256, "reference")
        stage.capture_graphs()
    return o


def run_kept(o: Omni, requests: list[dict]) -> tuple[dict, dict]:
    """Outputs, and each speech request's talker input rows (prompt rows, then reply rows)."""
    seen = {}
    outs = run_staggered(o, requests, on_step=lambda o, step, reqs: seen.update(reqs))
    rows = {}
    for rid, req in seen.items():
        talker = req.state.talker
        if talker is not None and talker.prompt_rows is not None:
            rows[rid] = torch.cat([talker.prompt_rows, torch.stack(talker.reply)])
    return outs, rows


def test_speech_rows_are_decode_graph_rows(monkeypatch):
    """A speech request's thinker decode row is a graph row (it was eager before); its talker's row
    that draws a code is one of the talker graph's, a prefill chunk ending in a draw is not."""
    o = graphed(monkeypatch)
    req = o.add(make_request(3))  # speech
    while len(req.state.talker.draws) < 2:
        assert not req.status.is_done, req.error
        o.engine.step()
    thinker, talker = o.engine.stages["thinker"].program, o.engine.stages["talker"].program
    st, num_prompt = req.state.thinker, req.state.thinker.prompt.num_prompt_tokens
    assert thinker.graph_rows([Chunk(req, st.num_tokens - 1, 1)]) == [True]
    drawn = num_prompt + 1 + len(req.state.talker.draws)  # the input that draws the next code
    assert talker.graph_rows([Chunk(req, drawn, 1), Chunk(req, drawn - 1, 2), Chunk(req, drawn - 1, 1)]) == [
        True,
        False,  # a chunk of two
        False,  # its code was drawn before (a recompute)
    ]
    talker.decode_graph.buckets = [1]
    assert talker.graph_rows([Chunk(req, drawn, 1)] * 2) == [False, False]  # fits no bucket: eager


def test_graph_paths_equal_eager_on_a_mixed_workload(monkeypatch):
    """Text and speech requests staggered (decode batches of up to 4 rows in graphs of 1, 2 and 4,
    larger ones eager): ids, codes and audio as each alone on the eager path; every talker input row
    (thinker hidden + embedding, kept from graph rows and eager rows) the eager run's to rounding."""
    o = graphed(monkeypatch)
    outs, rows = run_kept(o, workload())
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    _, eager_rows = run_kept(walk_omni(), workload())
    assert rows.keys() == eager_rows.keys() and len(rows) >= 4
    for rid, kept in rows.items():
        # Not bit for bit: a graph row's GEMMs run in its padded bucket (other row counts round
        # differently on the CPU as on the GPU): measured max |diff| 0 to 7e-7 on rows of RMS ~1.3.
        torch.testing.assert_close(kept, eager_rows[rid], rtol=0, atol=1e-5)
    stats = o.engine.stats()
    assert stats["thinker"]["graph_replays"] > 0 and stats["talker"]["graph_replays"] > 0
    assert stats["thinker"]["prefill_graph_replays"] > 0 and stats["talker"]["prefill_graph_replays"] > 0
    assert stats["talker"]["eager_decode_steps"] == 0  # (at most 4 speech requests talk at once here)
    assert_free(o)


def test_speech_only_thinker_steps_replay_the_graph(monkeypatch):
    """Speech requests alone: their thinker decode steps replay the graph (before, every one ran
    eagerly), with outputs equal to the eager path's."""
    o = graphed(monkeypatch)
    speech = [i for i in range(16) if i % 4 == 3]
    outs = run_staggered(o, [make_request(i) for i in speech])
    for i in speech:
        assert_same(outs[f"r{i}"], alone(i))
    stats = o.engine.stats()
    generated = sum(len(outs[f"r{i}"].token_ids) for i in speech)
    assert stats["thinker"]["graph_replays"] >= generated // 4  # (batches of up to four rows)
    assert stats["talker"]["graph_replays"] > 0
