"""The walk runtime on Qwen3-Omni (tiny, CPU): concurrency equals running alone, on every path.

24 requests over t2t, s2t, i2t, v2t, t2s, s2s, i2s, v2s and mixed inputs, of different lengths,
arrive staggered and run concurrently (greedy, EOS ignored); then aborts, KV pressure, an
injected failure and seeded sampling.
"""

import random
from functools import cache

import numpy as np
import pytest
import torch
from test_omni_text import checkpoint

from omniwalk import Omni

PATHS = ("t2t", "s2t", "i2t", "v2t", "t2s", "s2s", "i2s", "v2s", "si2s")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@cache
def omni(**options) -> Omni:
    return Omni(model=checkpoint("tiny"), **options)


def make_request(i: int, path: str, seed: int = 0, sampled: bool = False) -> dict:
    rng = np.random.default_rng(1000 * seed + i)
    content = [{"type": "text", "text": " ".join(["tell", "me", "about", "the", "world"][: 1 + i % 5])}]
    if "s" in path.split("2")[0]:
        content.append(
            {"type": "audio", "audio": (0.1 * rng.standard_normal(int(16000 * (0.5 + i % 3 * 0.7)))).astype(np.float32)}
        )
    if "i" in path.split("2")[0]:
        content.append({"type": "image", "image": rng.integers(0, 256, (40 + 10 * (i % 4), 70, 3), dtype=np.uint8)})
    if "v" in path.split("2")[0]:
        content.append({"type": "video", "video": rng.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8), "fps": 2.0})
    n = 3 + (7 * i) % 11
    request = {
        "request_id": f"r{i}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0.8 if sampled else 0.0,
        "seed": i,
    }
    if path.endswith("2s"):
        frames = 4 + (5 * i) % 23
        request.update(
            modalities=["text", "audio"],
            voice=("ethan", "chelsie", "aiden")[i % 3],
            max_audio_frames=frames,
            min_audio_frames=frames,
        )
        if not sampled:
            request.update(talker_temperature=0.0, code_predictor_temperature=0.0)
    return request


def workload(n: int = 24, **kw) -> list[dict]:
    return [make_request(i, PATHS[i % len(PATHS)], **kw) for i in range(n)]


@cache
def alone(i: int, sampled: bool = False):
    return omni().generate(make_request(i, PATHS[i % len(PATHS)], sampled=sampled))


def run_staggered(o: Omni, requests: list[dict], every: int = 2, on_step=None) -> dict:
    pending, reqs, step = list(requests), {}, 0
    while pending or o.engine.has_unfinished():
        if pending and step % every == 0:
            r = o.add(pending.pop(0))
            reqs[r.id] = r
        o.engine.step()
        if on_step:
            on_step(o, step, reqs)
        step += 1
    return {rid: o.output(r) for rid, r in reqs.items()}


def run_failing(o: Omni, program, method: str, fails, requests: list[dict], **run) -> dict:
    """``run_staggered`` with ``program.<method>`` raising RuntimeError("injected failure") wherever
    ``fails(*its arguments)`` holds (the method restored after); the outputs by request id."""
    original = getattr(program, method)

    def flaky(*args):
        if fails(*args):
            raise RuntimeError("injected failure")
        return original(*args)

    setattr(program, method, flaky)
    try:
        return run_staggered(o, requests, **run)
    finally:
        delattr(program, method)


def assert_only_failed(outs: dict, failed: str, requests: list[dict], alone, same) -> None:
    """The injected failure ended ``failed`` alone: an error naming it; every other output ``same`` as alone."""
    assert outs[failed].finish_reason == "error" and "injected failure" in outs[failed].error
    for i, request in enumerate(requests):
        if request["request_id"] != failed:
            same(outs[request["request_id"]], alone(i))


def assert_same(out, ref, exact_audio: bool = False):
    """Ids, text and codes identical; audio bit for bit when the vocoder decoded every stream alone
    (``vocoder_max_batch=1``), else to float rounding (convolutions round differently per batch size)."""
    assert out.token_ids == ref.token_ids and out.text == ref.text and out.finish_reason == ref.finish_reason
    if ref.codes is not None:
        assert torch.equal(out.codes, ref.codes)
        assert out.audio.shape == ref.audio.shape
        assert torch.equal(out.audio, ref.audio) if exact_audio else (out.audio - ref.audio).abs().max() <= 1e-5


def assert_idle(o: Omni):
    for stage in o.engine.stages.values():
        if hasattr(stage, "pool"):
            assert stage.pool.num_used == 0 and not stage.running and not stage.waiting and not stage.tables
        else:
            assert not stage.requests
    if "vocoder" in o.engine.stages:  # every stream slot of the vocoder's state pool is free again
        program = o.engine.stages["vocoder"].program
        assert not program.slots and sorted(program.free) == list(range(program.scratch))
    assert not o.engine.requests


@pytest.mark.parametrize("vocoder_max_batch", [1, 64])
def test_concurrent_staggered_equals_alone_on_every_path(vocoder_max_batch):
    o = omni(vocoder_max_batch=vocoder_max_batch)
    widest = []

    def watch(o, step, reqs):
        widest.append(o.engine.stages["vocoder"].last_batch_size)

    outs = run_staggered(o, workload(), on_step=watch)
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i), exact_audio=vocoder_max_batch == 1)
    assert max(widest) > 1  # streams were ready together (in one call unless vocoder_max_batch = 1)
    assert_idle(o)


def test_abort_a_third_leaves_the_rest_unchanged_and_frees_everything():
    o = omni()
    rng = random.Random(0)
    abort_at = {f"r{i}": rng.randint(1, 12) for i in rng.sample(range(24), 8)}
    aborted = set()

    def maybe_abort(o, step, reqs):
        for rid, at in abort_at.items():
            if rid in reqs and rid not in aborted and step >= 2 * int(rid[1:]) + at:
                aborted.add(rid) if o.abort(rid) else None

    outs = run_staggered(o, workload(), on_step=maybe_abort)
    for i, request in enumerate(workload()):
        rid = request["request_id"]
        if rid in aborted:
            assert outs[rid].finish_reason == "abort"
        else:
            assert_same(outs[rid], alone(i))
    assert aborted and len(aborted) >= 6
    assert_idle(o)


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_kv_pressure_preempts_and_still_completes_correctly(prefix_cache):
    """The workload needs ~2,900 thinker tokens of KV at once without shared prefix pages; give it a
    third (a quarter with them: the text requests share their system prompt's pages, and idle keyed
    pages are handed out again under the pressure)."""
    cfg = omni().family.cfg.text
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    tokens = 750 if prefix_cache else 1000
    o = Omni(model=checkpoint("tiny"), thinker_kv_bytes=tokens * per_token, page_size=8, prefix_cache=prefix_cache)
    outs = run_staggered(o, workload(), every=1)
    thinker = o.engine.stages["thinker"]
    assert thinker.num_preemptions > 0 and (thinker.num_prefix_tokens > 0) == prefix_cache
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    assert_idle(o)


def test_talker_kv_pressure_preempts_and_resumes_exactly():
    """Speech requests with talker KV for ~100 tokens: the talker preempts and re-feeds its input
    rows; a re-fed row must not draw its frame again (codes and audio equal to running alone)."""
    cfg = omni().family.cfg.talker.text
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


def test_injected_failure_fails_only_that_request():
    o = omni()
    talker = o.engine.stages["talker"].program
    outs = run_failing(o, talker, "_commit_frame", lambda req, frame: req.id == "r5", workload(12))
    assert_only_failed(outs, "r5", workload(12), alone, assert_same)
    assert_idle(o)


def test_seeded_sampling_is_the_same_alone_and_batched():
    o = omni()
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
    thinker.decode_graph = talker.frame_graph = SimpleNamespace(fits=lambda n: 0 < n <= 8)
    rows = [(req, seq - 1, 1), (req, 0, prompt), (req, prompt - 1, 1), (req, seq - 2, 1), (req, seq - 2, 2)]
    assert thinker.graph_rows(rows) == [True, False, False, False, False]
    assert thinker.graph_rows([(req, seq - 1, 1)] * 9) == [False] * 9  # fits no bucket: eager
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
