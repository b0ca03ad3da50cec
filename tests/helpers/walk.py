"""The walk runtime's workload on tiny Qwen3-Omni: requests on every input and output path, each run alone
or staggered among the others, and the checks that outputs match and everything is freed."""

from functools import cache

import numpy as np
import torch
from helpers.qwen3_omni import checkpoint

from omniwalk import Omni

PATHS = ("t2t", "s2t", "i2t", "v2t", "t2s", "s2s", "i2s", "v2s", "si2s")


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
