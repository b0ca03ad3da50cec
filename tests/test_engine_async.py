"""Asynchronous stepping (tiny model, CPU): outputs equal those of a synchronous loop.

The engine launches step N+1 before it reads step N back; ``Engine.drain`` after every step
completes everything launched at once, which is the synchronous loop (the oracle here). Stops
found one step late (stop tokens, stop strings, codec EOS) must drop the token or frame the next
step already made, so ids, text, codes and audio are the same either way.
"""

import pytest
import torch
from test_engine_omni import PATHS, alone, assert_idle, assert_same, make_request, omni, run_staggered
from test_omni_text import checkpoint

from omniwalk import Omni

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def synchronous(o, step, reqs):
    o.engine.drain()


def late_stops(o, step, reqs, seen: set):
    """Record requests that ended while the next step's token or frame was already launched."""
    for rid, req in reqs.items():
        th, ts = req.state.thinker, req.state.talker
        if th.is_finished and th.inflight:
            seen.add((rid, "token"))
        if ts is not None and ts.finished and ts.num_inflight:
            seen.add((rid, "frame"))


def stopping(requests: list[dict], refs) -> list[dict]:
    """The requests again, each stopped part-way by a stop token or a stop string taken from its
    own output (greedy ones), or left to run to ``max_tokens``."""
    out = []
    for i, (request, ref) in enumerate(zip(requests, refs, strict=True)):
        request = dict(request)
        middle = len(ref.token_ids) // 2
        if i % 3 == 0 and middle:
            request["stop_token_ids"] = [ref.token_ids[middle]]
        elif i % 3 == 1 and len(ref.text) >= 4:
            request["stop"] = [ref.text[len(ref.text) // 2 : len(ref.text) // 2 + 2]]
        out.append(request)
    return out


@pytest.mark.parametrize("sampled", [False, True])
def test_async_loop_equals_synchronous_loop_with_stops(sampled):
    o = omni()
    requests = [make_request(i, PATHS[i % len(PATHS)], sampled=sampled) for i in range(9)]
    requests = stopping(requests, [alone(i, sampled) for i in range(len(requests))])
    sync = run_staggered(o, requests, on_step=synchronous)
    seen = set()
    outs = run_staggered(o, requests, on_step=lambda o, step, reqs: late_stops(o, step, reqs, seen))
    for request in requests:
        assert_same(outs[request["request_id"]], sync[request["request_id"]])
    reasons = [outs[r["request_id"]].finish_reason for r in requests]
    assert reasons.count("stop") >= 3 and "length" in reasons
    assert any(kind == "token" for _, kind in seen)  # a stop read late: its next token was dropped
    assert_idle(o)


def test_codec_eos_read_late_drops_the_next_frame():
    """Codec EOS forced as soon as it is allowed (after ``min_audio_frames``): every speech request
    ends on EOS; the frame the next step drew from the EOS frame's codes is dropped."""
    o = Omni(model=checkpoint("tiny"))
    eos = o.model_config.talker.codec.eos
    hook = o.parts["talker"].codec_head.register_forward_hook(
        lambda m, args, out: out.index_fill(-1, torch.tensor([eos]), 1e4)
    )
    speech = [i for i in range(24) if PATHS[i % len(PATHS)].endswith("2s")][:6]
    requests = []
    for i in speech:
        request = make_request(i, PATHS[i % len(PATHS)])
        requests.append({**request, "min_audio_frames": 3 + i % 5, "max_audio_frames": 40})
    try:
        sync = run_staggered(o, requests, on_step=synchronous)
        seen = set()
        outs = run_staggered(o, requests, every=1, on_step=lambda o, step, reqs: late_stops(o, step, reqs, seen))
    finally:
        hook.remove()
    for request in requests:
        out = outs[request["request_id"]]
        assert_same(out, sync[request["request_id"]])
        assert out.codes.shape[0] == request["min_audio_frames"]  # ended on EOS, not the frame limit
    assert any(kind == "frame" for _, kind in seen)
    assert_idle(o)


def test_stages_wait_for_their_inputs_on_their_lanes():
    """On the CPU a lane runs on the host, but the data edges are the same calls as on CUDA: the
    thinker waits for the encoders' rows of a request it prefills, the talker for the thinker."""
    o = Omni(model=checkpoint("tiny"))
    reqs = [o.add(make_request(i, path)) for i, path in enumerate(["s2s", "i2t", "t2s"])]
    while o.engine.has_unfinished():
        o.engine.step()
    stages = o.engine.stages
    assert stages["thinker"].lane.num_waits >= 2  # the audio and the image request's encoder rows
    assert stages["talker"].lane.num_waits >= 2  # the two speech requests' thinker states
    assert all(r.error is None for r in reqs)
    assert set(reqs[0].produced) == {"audio_encoder", "thinker", "talker", "vocoder"}


def test_drain_completes_what_is_in_flight():
    o = Omni(model=checkpoint("tiny"))
    req = o.add({**make_request(0, "t2t"), "max_tokens": 6})
    for _ in range(3):
        o.engine.step()
    th = req.state.thinker
    assert th.inflight  # the newest step's token is still on the device
    launched = th.num_sampled
    o.engine.drain()
    assert not th.inflight and th.num_generated == launched
