"""The walk runtime on Qwen2.5-Omni (tiny, CPU): a concurrent staggered workload equals each
request alone on every input path, text out and audio out (every fourth request: talker codes and
token2wav audio, one-shot or streamed in windows); aborts, KV pressure and an injected failure
leave the others exact and free everything (KV pages, token2wav rows); seeded sampling is the
same alone and batched.

Qwen2.5-Omni's graphs on the CPU: the thinker's decode graph (which now also runs speech requests'
rows, returning their last hidden states and input embeddings), the talker's (projection, talker
decode, codec head), and both stages' prefill layers over padded layouts, each replayed by a stand-in
that keeps the graphs' contract without CUDA (static buffers per bucket, padding rows). A staggered
mixed workload through the graph paths equals each request alone on the eager path (ids, codes; audio
to rounding), and the talker's input rows equal the eager run's to GEMM rounding. Real CUDA graphs
against eager: the ``gpu`` test below.

Qwen2.5-Omni's decode graphs on the GPU (tiny model, bf16): the thinker's (speech rows included,
returning their hidden states and embeddings for the talker) and the talker's (projection, talker
decode, codec head), with the encoders' layer graphs, graphs on against graphs off through the engine
on a mixed workload of every input path (the encoders' graphs off in the eager run). No prefill
graphs (their padded layouts are other GEMM shapes, tested on their own in ``engine/test_graphs.py``)."""

import random

import pytest
import torch
from helpers.qwen2_5_omni import PATHS, alone, assert_free, assert_same, checkpoint, make_request, walk_omni, workload
from helpers.qwen3_omni import assert_only_aborted, assert_only_failed, run_aborting, run_failing, run_staggered
from helpers.replay import EagerReplay, ReplayOnCPU

from omniwalk import Omni
from omniwalk.engine import prefill_graphs
from omniwalk.engine.prefill_graphs import PrefillPlan
from omniwalk.engine.request import Chunk
from omniwalk.models.common.programs import thinker_program
from omniwalk.models.qwen2_5_omni.programs import talker_program


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_concurrent_staggered_equals_alone_on_every_path():
    o = walk_omni()
    widest = []

    def watch(o, step, reqs):
        widest.append([len(o.engine.stages[name].running) for name in ("thinker", "talker")])
        widest[-1].append(o.engine.stages["token2wav"].last_batch_size)

    outs = run_staggered(o, workload(), on_step=watch)
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    thinker, talker, token2wav = (max(column) for column in zip(*widest, strict=True))
    assert thinker >= 3 and talker >= 2 and token2wav >= 2  # requests really ran together
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_abort_a_third_leaves_the_rest_unchanged_and_frees_everything():
    o = walk_omni()
    rng = random.Random(0)
    abort_at = {f"r{i}": rng.randint(1, 8) for i in rng.sample(range(18), 6)}
    outs, aborted = run_aborting(o, workload(), abort_at)
    assert_only_aborted(outs, aborted, workload(), alone, assert_same)
    assert len(aborted) >= 4
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_kv_pressure_preempts_and_still_completes_correctly():
    cfg = walk_omni().family.cfg.text
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    o = Omni(model=checkpoint("tiny"), thinker_kv_bytes=600 * per_token, page_size=8, max_batch_tokens=64)
    outs = run_staggered(o, workload(), every=1)
    assert o.engine.stages["thinker"].num_preemptions > 0
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_talker_kv_pressure_preempts_and_resumes_exactly():
    """Speech requests with talker KV for 600 tokens: the talker preempts and recomputes its inputs;
    a recomputed input must not draw its code again (codes equal to running alone)."""
    cfg = walk_omni().family.cfg.talker.text
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    o = Omni(model=checkpoint("tiny"), talker_kv_bytes=600 * per_token, page_size=8, max_batch_tokens=64)
    speech = [i for i in range(18) if i % 4 == 3]
    outs = run_staggered(o, [make_request(i) for i in speech], every=1)
    assert o.engine.stages["talker"].num_preemptions > 0
    for i in speech:
        assert_same(outs[f"r{i}"], alone(i))
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_injected_failure_fails_only_that_request():
    o = walk_omni()
    thinker = o.engine.stages["thinker"].program
    outs = run_failing(o, thinker, "_commit", lambda req, pick: req.id == "r4", workload(9))
    assert_only_failed(outs, "r4", workload(9), alone, assert_same)
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_seeded_sampling_is_the_same_alone_and_batched():
    outs = run_staggered(walk_omni(), workload(8, sampled=True), every=1)
    for i, request in enumerate(workload(8, sampled=True)):
        assert_same(outs[request["request_id"]], alone(i, sampled=True))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_injected_token2wav_failure_fails_only_that_request():
    """A token2wav batch that raises is retried request by request: only the failing one fails, the
    others' audio (solved alone in that step instead of batched) is still exact to rounding."""
    o = walk_omni()
    token2wav = o.engine.stages["token2wav"].program

    def fails(req, window):  # its second window: after audio has started (streamed)
        return req.id == "r7" and window.start > 0

    outs = run_failing(o, token2wav, "_new_row", fails, workload(16), every=1)
    assert_only_failed(outs, "r7", workload(16), alone, assert_same)
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_streamed_audio_is_windowed_and_near_the_offline_audio():
    """``Omni.stream`` decodes token2wav window by window as codes arrive (3 chunks here); the
    offline output is one decode of the whole utterance. The DiT's receptive field spans windows
    once the ODE chains its steps, so they differ: bounded by waveform cosine >= 0.999 (measured
    >= 0.9999 with random weights; the window scheme's own bound is in test_qwen2_5_omni_token2wav)."""
    request = {**make_request(3), "min_audio_frames": 100, "max_audio_frames": 100, "request_id": None}
    offline = walk_omni().generate(request)
    events = [e.data for e in walk_omni().stream(request) if e.kind == "audio"]
    streamed = torch.cat(events)
    assert len(events) >= 3 and streamed.shape == offline.audio.shape == (100 * 480,)
    assert torch.nn.functional.cosine_similarity(streamed.double(), offline.audio.double(), dim=0) >= 0.999
    assert not torch.equal(streamed, offline.audio)  # (windowed: not the one-shot decode)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("audio_units", "vision_units"), [(65536, 1), (1, 65536)])
def test_audio_and_vision_encoders_have_their_own_budgets(audio_units, vision_units):
    """``audio_encoder_batch_units`` bounds audio encoder calls, ``vision_encoder_batch_units``
    vision ones (a budget of 1: each call one request, the larger item alone), and either way the
    answers equal each request alone (at the default budgets)."""
    o = Omni(model=checkpoint("tiny"), audio_encoder_batch_units=audio_units, vision_encoder_batch_units=vision_units)
    media = [i for i in range(12) if PATHS[i % len(PATHS)] != "t2t" and i % 4 != 3]  # (media in, text out)
    reqs = [o.add(make_request(i)) for i in media]  # all waiting at once: each encoder may batch them
    widest = {"audio_encoder": 0, "vision_encoder": 0}
    while o.engine.has_unfinished():
        o.engine.step()
        for name in widest:
            widest[name] = max(widest[name], o.engine.stages[name].last_batch_size)
    inputs = [PATHS[i % len(PATHS)].split("2")[0] for i in media]  # an unbounded encoder takes all of its own at once
    num_audio, num_vision = sum("s" in x or "a" in x for x in inputs), sum("i" in x or "v" in x for x in inputs)
    assert (widest["audio_encoder"], widest["vision_encoder"]) == (
        1 if audio_units == 1 else num_audio,
        1 if vision_units == 1 else num_vision,
    )
    for i, req in zip(media, reqs, strict=True):
        assert_same(o.output(req), alone(i))
    assert_free(o)


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


@pytest.mark.filterwarnings("ignore::UserWarning")
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
    talker.decode_graph.buckets = [1]  # two rows fit no bucket: graph rows still, replayed one at a time
    assert talker.graph_rows([Chunk(req, drawn, 1)] * 2) == [True, True] and talker.graph_batch() == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_graph_paths_equal_eager_on_a_mixed_workload(monkeypatch):
    """Text and speech requests staggered (decode batches of up to 4 rows in graphs of 1 and 2, larger
    ones replaying them in even pieces): ids, codes and audio as each alone on the eager path; every
    talker input row (thinker hidden + embedding, kept from graph rows and eager rows) the eager run's
    to rounding."""
    o = graphed(monkeypatch, max_batch=2)
    stage = o.engine.stages["thinker"]
    pieces = []  # each thinker step's graph forwards: their rows
    groups = stage._groups

    def recorded(batch):
        out = groups(batch)
        chunks = [[Chunk(req, stage.tables[req.id].num_cached, n) for req, n in g] for g in out]
        pieces.append([len(g) for g in chunks if all(stage.program.graph_rows(g))])
        return out

    monkeypatch.setattr(stage, "_groups", recorded)
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
    assert stats["thinker"]["eager_decode_steps"] == stats["talker"]["eager_decode_steps"] == 0
    assert max(max(step, default=0) for step in pieces) == 2 and [2, 2] in pieces and [1, 2] in pieces
    assert_free(o)


@pytest.mark.filterwarnings("ignore::UserWarning")
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


def _omni(graphs: int, encoder_graphs: int) -> Omni:
    return Omni(
        model=checkpoint("tiny"),
        device="cuda",
        dtype="bfloat16",
        cuda_graph_max_batch=graphs,
        encoder_graph_max_tokens=encoder_graphs,
        prefill_graph_max_tokens=0,
    )


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_decode_graphs_equal_eager_through_the_engine():
    """Same 16 requests (4 speech), graphs on and off: ids equal except where a padded bucket's
    GEMMs break a near tie (then the eager top-2 gap must be tiny); where a speech request's ids are
    equal its talker reads rows equal to GEMM rounding, so its codes may differ only at a near tie
    too: at least half of them must be equal, with audio of the same length and waveform cosine >= 0.999
    (token2wav's DiT layers run in bf16 in a bf16 model; the bf16 DiT against fp32: 0.999997)."""
    requests = [{**make_request(i), "logprobs": True, "top_logprobs": 2} for i in range(16)]
    eager, graphed = _omni(0, 0), _omni(8, 8192)
    a, b = eager.generate(requests), graphed.generate(requests)
    stats = graphed.engine.stats()
    print(f"GPU-Q25-GRAPHS stats thinker={stats['thinker']} talker={stats['talker']}")
    assert stats["thinker"]["graph_replays"] > 0 and stats["talker"]["graph_replays"] > 0
    assert stats["audio_encoder"]["graph_replays"] > 0  # (the shared graphed audio program)
    assert stats["vision_encoder"]["graph_replays"] > 0  # (runs of window blocks)
    assert eager.engine.stats()["talker"]["graph_replays"] == 0
    assert eager.engine.stats()["vision_encoder"]["graph_replays"] == 0
    same_ids, same_codes, speech = 0, 0, 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.error is None and y.error is None
        if x.token_ids != y.token_ids:
            k = next(j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=True)) if s != t)
            top = x.logprobs[k].top
            print(f"GPU-Q25-GRAPHS request {i}: ids differ first at {k}; eager top-2 gap {top[0][1] - top[1][1]:.4f}")
            assert top[0][1] - top[1][1] < 0.05
            continue
        same_ids += 1
        if x.codes is not None:
            speech += 1
            same_codes += x.codes == y.codes
            print(f"GPU-Q25-GRAPHS request {i}: codes equal {x.codes == y.codes} ({len(x.codes)} codes)")
            if x.codes == y.codes:  # (the DiT runs in bf16 here: a graph's padded rows round its GEMMs apart)
                assert x.audio.shape == y.audio.shape
                assert torch.nn.functional.cosine_similarity(x.audio.double(), y.audio.double(), dim=0) >= 0.999
    assert same_ids >= 12 and 2 * same_codes >= speech
