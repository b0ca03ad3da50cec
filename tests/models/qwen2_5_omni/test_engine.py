"""The walk runtime on Qwen2.5-Omni (tiny, CPU): a concurrent staggered workload equals each
request alone on every input path, text out and audio out (every fourth request: talker codes and
token2wav audio, one-shot or streamed in windows); aborts, KV pressure and an injected failure
leave the others exact and free everything (KV pages, token2wav rows); seeded sampling is the
same alone and batched."""

import random

import pytest
import torch
from helpers.qwen2_5_omni import PATHS, alone, assert_free, assert_same, checkpoint, make_request, walk_omni, workload
from helpers.qwen3_omni import assert_only_failed, run_failing, run_staggered

from omniwalk import Omni

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


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


def test_abort_a_third_leaves_the_rest_unchanged_and_frees_everything():
    o = walk_omni()
    rng = random.Random(0)
    abort_at = {f"r{i}": rng.randint(1, 8) for i in rng.sample(range(18), 6)}
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
    assert len(aborted) >= 4
    assert_free(o)


def test_kv_pressure_preempts_and_still_completes_correctly():
    cfg = walk_omni().family.cfg.text
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    o = Omni(model=checkpoint("tiny"), thinker_kv_bytes=600 * per_token, page_size=8, max_batch_tokens=64)
    outs = run_staggered(o, workload(), every=1)
    assert o.engine.stages["thinker"].num_preemptions > 0
    for i, request in enumerate(workload()):
        assert_same(outs[request["request_id"]], alone(i))
    assert_free(o)


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


def test_injected_failure_fails_only_that_request():
    o = walk_omni()
    thinker = o.engine.stages["thinker"].program
    outs = run_failing(o, thinker, "_commit", lambda req, pick: req.id == "r4", workload(9))
    assert_only_failed(outs, "r4", workload(9), alone, assert_same)
    assert_free(o)


def test_seeded_sampling_is_the_same_alone_and_batched():
    outs = run_staggered(walk_omni(), workload(8, sampled=True), every=1)
    for i, request in enumerate(workload(8, sampled=True)):
        assert_same(outs[request["request_id"]], alone(i, sampled=True))


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
