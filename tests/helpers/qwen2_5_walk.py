"""The walk runtime's workload on tiny Qwen2.5-Omni: requests on every input path, each run alone, and
the checks that outputs match and KV pages and token2wav rows are freed."""

from functools import cache

import numpy as np
from helpers.qwen2_5_omni import checkpoint
from helpers.walk import assert_idle

from omniwalk import Omni

PATHS = ("t2t", "s2t", "i2t", "v2t", "si2t", "av2t")


@cache
def omni(**options) -> Omni:
    return Omni(model=checkpoint("tiny"), **options)


def make_request(i: int, sampled: bool = False) -> dict:
    path, rng = PATHS[i % len(PATHS)], np.random.default_rng(i)
    inputs = path.split("2")[0]
    content = [{"type": "text", "text": " ".join(["tell", "me", "about", "the", "world"][: 1 + i % 5])}]
    wave = (0.1 * rng.standard_normal(int(16000 * (0.5 + i % 3 * 0.7)))).astype(np.float32)
    if inputs in ("s", "si"):
        content.append({"type": "audio", "audio": wave})
    if "i" in inputs:
        content.append({"type": "image", "image": rng.integers(0, 256, (40 + 10 * (i % 4), 70, 3), dtype=np.uint8)})
    if "v" in inputs:
        video = {"type": "video", "video": rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8), "fps": 2.0}
        content.append({**video, "audio": wave} if "a" in inputs else video)
    request = {
        "request_id": f"r{i}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3 + (7 * i) % 11,
        "ignore_eos": True,
        "temperature": 0.8 if sampled else 0.0,
        "seed": i,
        "use_audio_in_video": "a" in inputs,
    }
    if i % 4 == 3:  # speech; every other one streamed, with 64 codes more (2 to 4 DiT windows of 72 mel frames)
        streamed = i % 8 == 7
        codes = 24 + (29 * i) % 70 + 64 * streamed
        request.update(modalities=["text", "audio"], voice=("Chelsie", "ethan")[i % 2], max_audio_frames=codes)
        request.update(min_audio_frames=codes, talker_temperature=0.9 if sampled else 0.0, stream=streamed)
        request.update(token2wav_num_steps=(3, 4, None)[i % 3])  # (None: the default 10)
    return request


def assert_free(o: Omni):
    """Every stage idle, KV pages free, and token2wav holds no rows (windows being solved) for anyone."""
    assert_idle(o)
    program = o.engine.stages["token2wav"].program
    assert not any(program.rows.values()) and not program.starting


def workload(n: int = 18, **kw) -> list[dict]:
    return [make_request(i, **kw) for i in range(n)]


@cache
def alone(i: int, sampled: bool = False):
    return omni().generate(make_request(i, sampled=sampled))


def assert_same(out, ref):
    """Ids, text and codes identical; audio to float rounding (token2wav's batched ODE steps pad rows
    to the longest: measured max |diff| < 1e-6 at RMS ~0.1)."""
    assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason)
    assert out.codes == ref.codes and (ref.codes is None or len(ref.codes) > 3)
    if ref.codes is not None:
        assert out.audio.shape == ref.audio.shape == (len(ref.codes) * 2 * 240,) and ref.audio.std() > 0.01
        assert (out.audio - ref.audio).abs().max() < 1e-5
