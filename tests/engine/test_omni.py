"""The walk runtime on Qwen3-Omni (tiny, CPU): concurrency equals running alone, on every path.

24 requests over t2t, s2t, i2t, v2t, t2s, s2s, i2s, v2s and mixed inputs, of different lengths,
arrive staggered and run concurrently (greedy, EOS ignored); then aborts, KV pressure, an
injected failure and seeded sampling.
"""

import random

import pytest
import torch
from helpers.qwen3_omni import (
    PATHS,
    alone,
    assert_idle,
    assert_only_aborted,
    assert_only_failed,
    assert_same,
    checkpoint,
    make_request,
    run_aborting,
    run_failing,
    run_staggered,
    walk_omni,
    workload,
)
from helpers.single_request import chunk_schedule

from omniwalk import Omni

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("vocoder_max_batch", [1, 64])
def test_concurrent_staggered_equals_alone_on_every_path(vocoder_max_batch):
    o = walk_omni(vocoder_max_batch=vocoder_max_batch)
    widest = []

    def watch(o, step, reqs):
        widest.append(o.engine.stages["vocoder"].last_batch_size)

    outs = run_staggered(o, workload(), on_step=watch)
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i), exact_audio=vocoder_max_batch == 1)
    assert max(widest) > 1  # streams were ready together (in one call unless vocoder_max_batch = 1)
    assert_idle(o)


def test_abort_a_third_leaves_the_rest_unchanged_and_frees_everything():
    o = walk_omni()
    rng = random.Random(0)
    abort_at = {f"r{i}": rng.randint(1, 12) for i in rng.sample(range(24), 8)}
    outs, aborted = run_aborting(o, workload(), abort_at)
    assert_only_aborted(outs, aborted, workload(), alone, assert_same)
    assert aborted and len(aborted) >= 6
    assert_idle(o)


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_kv_pressure_preempts_and_still_completes_correctly(prefix_cache):
    """The workload needs ~2,900 thinker tokens of KV at once without shared prefix pages; give it a
    third (a quarter with them: the text requests share their system prompt's pages, and idle keyed
    pages are handed out again under the pressure)."""
    cfg = walk_omni().family.cfg.text
    # a token's keys and values in every layer, and the prompt row kept beside them (the model speaks)
    per_token = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim + 2 * cfg.hidden_size) * 4
    tokens = 750 if prefix_cache else 1000
    o = Omni(model=checkpoint("tiny"), thinker_kv_bytes=tokens * per_token, page_size=8, prefix_cache=prefix_cache)
    outs = run_staggered(o, workload(), every=1)
    thinker = o.engine.stages["thinker"]
    assert thinker.num_preemptions > 0 and (thinker.num_prefix_tokens > 0) == prefix_cache
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    assert_idle(o)


def test_a_request_larger_than_the_whole_kv_pool_fails_alone():
    """A request that needs more thinker KV at once than the whole pool holds fails with a typed
    error naming the pool (it would be preempted and readmitted forever), whether it arrives alone
    or beside another; the requests that fit complete as they would alone."""
    cfg = walk_omni().family.cfg.text
    per_token = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim + 2 * cfg.hidden_size) * 4
    o = Omni(model=checkpoint("tiny"), thinker_kv_bytes=160 * per_token, page_size=8, prefix_cache=False)
    capacity = o.engine.stages["thinker"].pool.num_pages * 8
    long = make_request(1, "t2t") | {"request_id": "long", "max_tokens": 200}  # ~105 prompt tokens + 200
    long["messages"][0]["content"][0]["text"] = "word " * 60
    for together in ([long], [make_request(0, "t2t"), long, make_request(2, "t2t")]):
        outs = run_staggered(o, together, every=1)
        assert outs["long"].finish_reason == "error" and f"({capacity} tokens)" in outs["long"].error
        for request in together[::2] if len(together) > 1 else []:
            assert_same(outs[request["request_id"]], walk_omni().generate(request))
    assert_idle(o)


def test_talker_kv_pressure_preempts_and_resumes_exactly():
    """Speech requests with talker KV for ~100 tokens: the talker preempts and re-feeds its input
    rows; a re-fed row must not draw its frame again (codes and audio equal to running alone)."""
    cfg = walk_omni().family.cfg.talker.text
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    o = Omni(model=checkpoint("tiny"), talker_kv_bytes=100 * per_token, page_size=8)
    speech = [i for i in range(24) if PATHS[i % len(PATHS)] in ("t2s", "s2s")][:4]
    outs = run_staggered(o, [make_request(i, PATHS[i % len(PATHS)]) for i in speech], every=1)
    assert o.engine.stages["talker"].num_preemptions > 0
    for i in speech:
        assert_same(outs[f"r{i}"], alone(i))
    assert_idle(o)


def test_vocoder_streams_wait_for_a_free_state_slot():
    """With one stream slot in the vocoder's state pool, streams take turns: a stream with a chunk
    ready waits while another holds the slot, and every output is still exact."""
    o = Omni(model=checkpoint("tiny"))
    program, waited = o.engine.stages["vocoder"].program, []
    first = o.config.family.vocoder_first_chunk_frames
    lent, program.free = program.free[:-1], program.free[-1:]  # keep one slot

    def watch(o, step, reqs):
        ready = [r for r in o.engine.stages["vocoder"].requests.values() if len(r.state.talker.frames) >= first]
        waited.append(any(r.id not in program.slots for r in ready))

    outs = run_staggered(o, workload(12), every=1, on_step=watch)
    assert any(waited)
    for i, request in enumerate(workload(12)):
        assert_same(outs[request["request_id"]], alone(i))
    program.free += lent
    assert_idle(o)


def test_streamed_audio_follows_the_growing_chunk_schedule(monkeypatch):
    """A streamed answer of 72 frames comes as chunks of 5, 5, 10, 20, 25 and 7 frames, each decoded
    at its scheduled width (the last padded to 25); their concatenation equals both the old cut (5,
    then 25s) and the one-shot decode, within the streaming tolerance (1e-5)."""
    o = walk_omni()
    program = o.engine.stages["vocoder"].program
    vocoder, calls, call = program.vocoder, [], program._call

    def recorded(width, fresh, items):
        calls.append((width, fresh, [req for req, _ in items]))
        return call(width, fresh, items)

    monkeypatch.setattr(program, "_call", recorded)
    request = make_request(4, "t2s") | {"request_id": "schedule", "max_audio_frames": 72, "min_audio_frames": 72}
    chunks = [event.data for event in o.stream(request) if event.kind == "audio"]
    sizes = chunk_schedule(program.config, 72)
    assert sizes == [5, 5, 10, 20, 25, 7]
    per_frame = vocoder.cfg.samples_per_frame
    assert [len(c) for c in chunks] == [vocoder.num_samples(sizes[0])] + [n * per_frame for n in sizes[1:]]
    assert [(width, fresh) for width, fresh, _ in calls] == [*program.config.chunk_kinds(), (25, False)]
    req = calls[0][2][0]
    assert [r.id for *_, reqs in calls for r in reqs] == ["schedule"] * len(calls)
    codes = torch.stack(req.state.talker.frames)
    with torch.inference_mode():
        state, old = vocoder.new_state(), []
        for start, end in [(0, 5), (5, 30), (30, 55), (55, 72)]:  # the old cut: a first chunk of 5, then 25s
            old.append(vocoder.decode(codes[None, start:end], state)[0].float())
        whole = vocoder(codes[None])[0].float()
    streamed = torch.cat(chunks)
    assert streamed.shape == whole.shape == (vocoder.num_samples(72),)
    assert (streamed - torch.cat(old)).abs().max() <= 1e-5 and (streamed - whole).abs().max() <= 1e-5
    assert_idle(o)


def test_injected_failure_fails_only_that_request():
    o = walk_omni()
    talker = o.engine.stages["talker"].program
    outs = run_failing(o, talker, "_commit_frame", lambda req, frame: req.id == "r5", workload(12))
    assert_only_failed(outs, "r5", workload(12), alone, assert_same)
    assert_idle(o)


def test_seeded_sampling_is_the_same_alone_and_batched():
    o = walk_omni()
    outs = run_staggered(o, workload(10, sampled=True), every=1)
    for i, request in enumerate(workload(10, sampled=True)):
        assert_same(outs[request["request_id"]], alone(i, sampled=True))


def test_graph_rows_are_exactly_the_rows_that_decode_and_draw():
    """Which rows a captured graph may run (it samples every row it runs): the thinker's rows that
    decode their one next generated token; the talker's rows that run one input row and then draw
    a frame. Everything else (prompt chunks, recompute chunks, rows mid-input) stays eager."""
    from types import SimpleNamespace

    o = Omni(model=checkpoint("tiny"))
    thinker, talker = o.engine.stages["thinker"].program, o.engine.stages["talker"].program
    req = o.add(make_request(1, "t2s"))
    while len(req.state.talker.frames) < 2:
        o.engine.step()
    o.engine.drain()  # nothing in flight: the rows below are read-back tokens and frames
    th, ts = req.state.thinker, req.state.talker
    prompt, seq = th.prompt.num_prompt_tokens, len(th.seq)
    assert thinker.graph_rows([(req, seq - 1, 1)]) == [False]  # no graph captured (CPU)
    thinker.decode_graph = talker.frame_graph = SimpleNamespace(max_batch=8)
    rows = [(req, seq - 1, 1), (req, 0, prompt), (req, prompt - 1, 1), (req, seq - 2, 1), (req, seq - 2, 2)]
    assert thinker.graph_rows(rows) == [True, False, False, False, False]
    # more rows than the largest bucket are still graph rows: the stage replays the graph in pieces
    assert thinker.graph_rows([(req, seq - 1, 1)] * 9) == [True] * 9 and thinker.graph_batch() == 8
    inputs = ts.num_inputs
    rows = [(req, inputs, 1), (req, inputs - 1, 1), (req, inputs - 2, 1), (req, 0, inputs)]
    # the last input row re-fed (after a preemption) drew its frame already: no frame, eager
    assert talker.graph_rows(rows) == [True, False, False, False]
    assert talker._prefill_rows(ts, 5) == 5  # a recompute whose last row drew its frame: all of it now
    last = ts.frames.pop()  # now the last input row's frame is due (as right after a prefill)
    assert talker.graph_rows(rows) == [False, True, False, False]
    assert talker._prefill_rows(ts, 5) == 4  # the last row is left for the graph's next step
    assert talker._prefill_rows(ts, 1) == 1
    ts.frames.append(last)
