"""The engine's step loop: asynchronous stepping gives the outputs of a synchronous loop, and the loop reads
from the device only where it must.

Asynchronous stepping (tiny model, CPU): outputs equal those of a synchronous loop.

The engine launches step N+1 before it reads step N back; ``Engine.drain`` after every step
completes everything launched at once, which is the synchronous loop (the oracle here). Stops
found one step late (stop tokens, stop strings, codec EOS) must drop the token or frame the next
step already made, so ids, text, codes and audio are the same either way.

Asynchronous stepping and stage streams on the GPU: the same outputs as a synchronous loop.

The engine's loop (each stage on its own stream, step N+1 launched before step N is read) against
the same engine drained after every step (``Engine.drain``: every read and commit done before the
next launch). Batches differ between the two where a request's stop is read late (the extra row
rides along) and bf16 GEMMs round differently per batch size, so greedy ids may part at a near tie
(allowed where the top-2 logprobs are that close); where ids agree, codes and audio must too.

CPU-side guard for the step loop's host reads (the GPU machine counts real synchronisations: the
``gpu`` test below; this one runs in CI).

Every ``tolist`` / ``item`` / ``cpu`` / ``numpy`` call that omniwalk code makes while the engine
steps a mixed workload (all media kinds arriving, text and speech out) must come from an allowed
place: the step's read of sampled ids, or a reference backend (the CPU oracles; on CUDA the
fast backends replace them). (The talker's frames and the vocoder's audio come back through
``device.HostCopy``, an asynchronous copy waited for in the stage's ``finish``, not through these
methods.) A new read elsewhere, e.g. a ``.tolist()`` of a device tensor in a stage, fails here
before it costs a GPU synchronisation.

The step loop reads from the device only where it must (GPU machine only).

Steady state of a mixed text + speech workload (thinker decode, talker + code-predictor steps,
vocoder chunks), with a request carrying audio arriving in the middle (audio encoder, thinker
prefill), runs under ``torch.cuda.set_sync_debug_mode("warn")``; every synchronising call is
counted. Allowed per step: one read of sampled ids per KV stage that sampled (thinker, talker) and
one copy of each finished audio chunk to the host (the output itself)."""

import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.qwen3_omni import (
    PATHS,
    alone,
    assert_idle,
    assert_same,
    checkpoint,
    make_request,
    run_staggered,
    walk_omni,
)

import omniwalk
from omniwalk import Omni
from omniwalk.engine.kv_stage import KVProgram
from omniwalk.engine.request import Status


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


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("sampled", [False, True])
def test_async_loop_equals_synchronous_loop_with_stops(sampled):
    o = walk_omni()
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


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_codec_eos_read_late_drops_the_next_frame():
    """Codec EOS forced as soon as it is allowed (after ``min_audio_frames``): every speech request
    ends on EOS; the frame the next step drew from the EOS frame's codes is dropped."""
    o = Omni(model=checkpoint("tiny"))
    eos = o.family.cfg.talker.codec.eos
    hook = o.family.parts["talker"].codec_head.register_forward_hook(
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


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_requests_whose_inputs_cross_stages_finish(monkeypatch):
    """The thinker prefills with the encoders' rows, the talker follows the thinker's states, all
    launched on one stream (engine/inflight.py): every request finishes with its whole walk. Its
    start in each stage (its first launch there, read on a clock that counts steps) follows the data:
    the thinker no earlier than an encoder (the prompt's text before the media may go first), the
    talker and the vocoder steps after the stage that feeds each."""
    step = [0]
    monkeypatch.setattr(omniwalk.engine.inflight, "time", type("StepClock", (), {"monotonic": lambda: step[0]}))
    o = Omni(model=checkpoint("tiny"))
    reqs = [o.add(make_request(i, path)) for i, path in enumerate(["s2s", "i2t", "t2s"])]
    for r in reqs:
        r.created = 0.0
    while o.engine.has_unfinished():
        o.engine.step()
        step[0] += 1
    assert all(r.error is None and r.status is Status.FINISHED for r in reqs)
    assert reqs[0].walk == ("audio_encoder", "thinker", "talker", "vocoder")
    out = o.output(reqs[0])
    assert out.token_ids and out.audio is not None and out.audio.numel() > 0
    for r in reqs:
        starts = r.stage_starts()
        assert tuple(starts) == r.walk, (r.walk, starts)  # every stage reached, in the walk's order
        for feeder, stage in zip(r.walk, r.walk[1:], strict=False):
            assert starts[stage] > starts[feeder] if stage in ("talker", "vocoder") else starts[stage] >= starts[feeder]
    assert reqs[2].stage_starts()["thinker"] == 0  # (a text prompt: its first step, not its last)


@pytest.mark.filterwarnings("ignore::UserWarning")
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


class LookaheadToy(KVProgram):
    """The engine-level contract on its own: test_engine_core's toy LM, its sampled token kept as a
    tensor until the commit one step later; it stops at ``stop_at`` tokens or on a stop token."""

    def __init__(self, stop_token: int):
        from helpers.toy_lm import ToyLM, ToyProgram

        self.toy, self.stop_token = ToyProgram(ToyLM()), stop_token

    def num_ready(self, req, num_cached):
        st = req.state
        if st.get("done") or len(st["seq"]) + len(st.setdefault("inflight", [])) >= st["stop_at"]:
            return 0
        return len(st["seq"]) + len(st["inflight"]) - num_cached

    def run(self, batch, kv):
        m = self.toy.model
        ids = torch.cat([self._ids(req.state, s, n) for req, s, n in batch])
        x = m.embed[ids]
        q, k, v = (x @ m.qkv).view(len(ids), 3, 2, 16).unbind(1)
        h = kv.attend(0, q, k, v).reshape(len(ids), 32) + x
        kv.advance(len(ids))
        ends = torch.tensor([n for _, _, n in batch]).cumsum(0) - 1
        picks = (h[ends] @ m.head).argmax(-1)
        ready = [
            (req, picks[row : row + 1])
            for row, (req, s, n) in enumerate(batch)
            if s + n == len(req.state["seq"]) + len(req.state["inflight"])
        ]
        for req, pick in ready:
            req.state["inflight"].append(pick)

        def commit():
            for req, _ in ready:
                token = int(req.state["inflight"].pop(0))
                if req.state.get("done") or req.status.is_done:
                    req.state["dropped"] = True  # sampled after the stop: rolled back
                    continue
                req.state["seq"].append(token)
                req.emit("text", token)
                req.state["done"] = token == self.stop_token or len(req.state["seq"]) >= req.state["stop_at"]

        return commit

    @staticmethod
    def _ids(st, start, n):
        """Read-back ids from the host list, the rest from the tensors still in flight."""
        seq, inflight = st["seq"], st["inflight"]
        host = torch.tensor(seq[start : start + n], dtype=torch.long)
        return torch.cat([host, *inflight[max(start - len(seq), 0) : start + n - len(seq)]])

    def is_finished(self, req):
        return bool(req.state.get("done"))

    def on_preempt(self, req):
        pass


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("num_pages", [256, 20])
def test_one_step_lookahead_on_the_toy_engine_equals_the_synchronous_loop(num_pages):
    from helpers.toy_lm import DIM, HEADS, drive, generated, workload

    from omniwalk.engine.engine import Engine
    from omniwalk.engine.kv_pages import KVStorage, PagePool
    from omniwalk.engine.kv_stage import KVStage, KVStageConfig

    def engine():
        storage = KVStorage(PagePool(num_pages, 4), 1, HEADS, DIM // HEADS, torch.float32, "cpu")
        stage = KVStage("lm", LookaheadToy(stop_token=7), storage, KVStageConfig(64, 64), "cpu")
        return Engine([stage]), stage

    (sync_engine, _), (ours, stage) = engine(), engine()
    sync = drive(sync_engine, workload(), on_step=lambda step, reqs: sync_engine.drain())
    outs = drive(ours, workload())
    for rid in sync:
        assert generated(outs[rid]) == generated(sync[rid]), rid
    assert any(r.state.get("dropped") for r in outs.values())  # a stop read late, its next token dropped
    assert any(generated(r)[-1] == 7 for r in outs.values())
    assert stage.pool.num_used == 0 and (num_pages == 256 or stage.num_preemptions > 0)


def _run(omni, requests, synchronous: bool):
    reqs = [omni.add(dict(r, request_id=f"r{i}")) for i, r in enumerate(requests)]
    while omni.engine.has_unfinished():
        omni.engine.step()
        if synchronous:
            omni.engine.drain()
    return [omni.output(r) for r in reqs]


def _mixed_requests():
    from helpers.qwen3_omni import gpu_requests, make_request

    media = [make_request(i, path) for i, path in enumerate(["s2s", "i2t", "s2t", "i2s"])]
    for r in media:
        r.update(logprobs=True, top_logprobs=2)
    return gpu_requests() + media


@pytest.mark.gpu
def test_async_equals_synchronous_loop_on_the_gpu():
    from helpers.qwen3_omni import gpu_omni

    omni = gpu_omni(8)
    requests = _mixed_requests()
    sync, ours = _run(omni, requests, True), _run(omni, requests, False)
    same = 0
    for i, (x, y) in enumerate(zip(sync, ours, strict=True)):
        assert x.error is None and y.error is None
        if x.token_ids != y.token_ids:
            k = next(j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if s != t)
            top = x.logprobs[k].top
            print(f"GPU-ASYNC request {i}: ids differ first at {k}; top-2 logprob gap {top[0][1] - top[1][1]:.4f}")
            assert top[0][1] - top[1][1] < 0.05 or x.logprobs[k].token_id != top[0][0]
            continue
        same += 1
        if x.codes is not None:
            # equal ids: the talker's frames and the audio must agree too (outputs carry no talker logprobs
            # to prove a near tie with, so a difference fails, with where the codes first part)
            assert y.codes is not None and x.codes.shape == y.codes.shape, (i, x.codes.shape, y.codes)
            parted = (x.codes != y.codes).any(dim=1).nonzero()
            assert len(parted) == 0, f"request {i}: ids equal, codes differ first at frame {int(parted[0])}"
            assert x.audio.shape == y.audio.shape, (i, x.audio.shape, y.audio.shape)
            err = (x.audio - y.audio).abs().max().item()
            print(f"GPU-ASYNC request {i}: ids and codes equal, audio max abs difference {err:.2e}")
            assert err < 2e-2
    assert same >= len(requests) - 3


@pytest.mark.gpu
def test_stages_keep_their_own_graph_pools():
    """Each KV stage captures into a graph pool of its own."""
    from helpers.qwen3_omni import gpu_omni

    omni = gpu_omni(4)
    thinker, talker = omni.engine.stages["thinker"].program, omni.engine.stages["talker"].program
    thinker_pool = next(iter(thinker.decode_graph.keyed.graphs.values()))[0].pool()
    talker_pool = next(iter(talker.frame_graph.keyed.graphs.values()))[0].pool()
    assert thinker_pool != talker_pool


PACKAGE = str(Path(omniwalk.__file__).parent) + "/"  # (a checkout may itself be named omniwalk)

ALLOWED = {
    ("sampling.py", "picks"),  # the thinker's one read of sampled ids (and logprobs)
    ("layers/moe.py", "reference_experts"),  # reference backends: CPU only
    ("layers/kv_attention.py", "paged_decode_reference"),
    ("layers/attention.py", "reference_attention"),
    # host tensors the processor made (positions, media pixels), digested into the prefix pages' keys at add
    ("models/common/programs/prefix_keys.py", "prefix_chain"),
    ("media/preprocess.py", "feed_digest"),  # (media parts without the HTTP process's digest: offline)
    ("models/qwen3_omni/programs/talker_program.py", "prefix_keys"),  # (and the prompt's user positions)
}
READS = ("tolist", "item", "cpu", "numpy")


@pytest.fixture
def record_reads(monkeypatch):
    sites = Counter()

    def wrap(name):
        original = getattr(torch.Tensor, name)

        def recorded(self, *args, **kwargs):
            ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PACKAGE)]
            if ours:
                sites[(ours[-1].filename.removeprefix(PACKAGE), ours[-1].name)] += 1
            return original(self, *args, **kwargs)

        return recorded

    def start():
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, wrap(name))

    return sites, start


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_step_loop_reads_back_only_through_allowed_places(record_reads):
    sites, start = record_reads
    o = Omni(model=checkpoint("tiny"))
    requests = [make_request(i, path) for i, path in enumerate(["s2s", "i2t", "t2s", "s2t", "si2s", "v2t", "v2s"])]
    reqs = [o.add(r) for r in requests[:2]]
    o.engine.step()
    start()  # from here on: requests arriving with every media kind, prefills, decodes, speech
    for r in requests[2:]:
        reqs.append(o.add(r))
        o.engine.step()
    while o.engine.has_unfinished():
        o.engine.step()
    assert all(r.error is None for r in reqs)
    unexpected = {site: n for site, n in sites.items() if site not in ALLOWED}
    assert not unexpected, f"host reads outside the allowed places: {unexpected}"
    assert sites[("sampling.py", "picks")] > 0


@pytest.mark.gpu
def test_steady_state_steps_read_back_only_sampled_ids_and_audio():
    from helpers.qwen3_omni import checkpoint

    from omniwalk import Omni

    o = Omni(model=checkpoint("tiny"), device="cuda", dtype="bfloat16", moe_backend="fused")
    base = {"messages": [{"role": "user", "content": "tell me about the world"}], "ignore_eos": True}
    speech = {
        "modalities": ["text", "audio"],
        "talker_temperature": 0.0,
        "min_audio_frames": 60,
        "max_audio_frames": 60,
        "max_tokens": 40,
    }
    reqs = [
        o.add({**base, "max_tokens": 80, "temperature": 0.0}),
        o.add({**base, "max_tokens": 80, "temperature": 0.7, "seed": 1}),
        o.add({**base, **speech}),
        o.add({**base, **speech, "voice": "chelsie"}),
    ]
    for _ in range(12):  # prefills, talker prefixes, first vocoder chunks
        o.engine.step()
    clip = (0.1 * np.random.default_rng(0).standard_normal(24000)).astype(np.float32)
    content = [{"type": "audio", "audio": clip}, {"type": "text", "text": "and?"}]
    heard = {"messages": [{"role": "user", "content": content}]}
    steps, allowed, syncs = 20, 0, []
    for i in range(steps):
        if i == 5:  # an arrival with audio: the audio encoder and a prefill chunk inside the counted steps
            reqs.append(o.add({**heard, "max_tokens": 8, "ignore_eos": True}))
        frames_before = sum(len(r.state.talker.frames) for r in reqs if r.state.talker)
        chunks_before = sum(len(r.state.vocoder.chunks) for r in reqs if r.state.vocoder)
        tokens_before = sum(r.state.thinker.num_generated for r in reqs)
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *a, **k: (
                syncs.append(_site()) if "called a synchronizing CUDA operation" in str(message) else None
            )
            torch.cuda.set_sync_debug_mode("warn")
            try:
                o.engine.step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        allowed += int(sum(r.state.thinker.num_generated for r in reqs) > tokens_before)
        allowed += int(sum(len(r.state.talker.frames) for r in reqs if r.state.talker) > frames_before)
        allowed += sum(len(r.state.vocoder.chunks) for r in reqs if r.state.vocoder) - chunks_before
    print(f"SYNC-CHECK {steps} steps: {len(syncs)} synchronising calls, {allowed} allowed")
    for site, count in Counter(syncs).most_common():
        print(f"SYNC {count:4d} at {site}")
    assert allowed > 0 and len(syncs) <= allowed
    assert all(not r.status.is_done or r.error is None for r in reqs)


def _site() -> str:
    """The innermost omniwalk frame of the synchronising call."""
    stack = traceback.extract_stack()[:-2]  # without this helper and the warning hook
    frames = [f for f in stack if "/omniwalk/" in f.filename] or stack[-1:]
    return f"{frames[-1].filename.split('/omniwalk/')[-1]}:{frames[-1].lineno} {frames[-1].line}"
