"""CPU-side guard for the step loop's host reads (the GPU machine counts real synchronisations: the
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
from helpers.qwen3_omni import checkpoint, make_request

import omniwalk
from omniwalk import Omni

PACKAGE = str(Path(omniwalk.__file__).parent) + "/"  # (a checkout may itself be named omniwalk)

ALLOWED = {
    ("sampling.py", "picks"),  # the thinker's one read of sampled ids (and logprobs)
    ("layers/moe.py", "reference_experts"),  # reference backends: CPU only
    ("layers/kv_attention.py", "paged_decode_reference"),
    ("layers/attention.py", "reference_attention"),
    # the prompt's positions, a host tensor the processor made (digested into the prefix pages' keys at add)
    ("models/common/programs/thinker_program.py", "prefix_keys"),
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
