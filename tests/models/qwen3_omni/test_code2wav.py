"""Code2Wav: checkpoint loading, one-shot parity with HF, and exact streaming (streamed == one-shot)."""

import copy
from functools import cache

import numpy as np
import pytest
import torch
from helpers.hf_oracle import config_dict, hf_checkpoint, hf_model
from helpers.qwen3_omni import make_audio_like_
from helpers.single_request import VocoderStream, chunk_schedule, decode_in_chunks

from omniwalk.models.common.checkpoint.weights import load_weights
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig

NAMES = ["tiny", "uneven"]


@cache
def audio_like_pair(name: str):
    """(HF code2wav, ours) with identical, audio-like random weights."""
    hf = copy.deepcopy(hf_model(name, 0).code2wav)
    make_audio_like_(hf, _codes(40, hf.config.num_quantizers, seed=0).transpose(1, 2))
    ours = Code2Wav(Qwen3OmniConfig.from_hf(config_dict(name)).code2wav).eval()
    ours.load_state_dict(hf.state_dict())
    return hf, ours


def _codes(num_frames: int, groups: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, num_frames, groups), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_loads_exactly(name):
    ckpt = hf_checkpoint(name)
    ours = Code2Wav(Qwen3OmniConfig.from_hf(ckpt).code2wav)
    load_weights(ours, ckpt, prefix="code2wav.")
    reference = hf_model(name, 0).code2wav.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, reference[key]), key


@pytest.mark.parametrize("name", NAMES)
def test_one_shot_matches_hf(name):
    hf, ours = audio_like_pair(name)
    groups = hf.config.num_quantizers
    for num_frames in (1, 7, 29, 90):
        codes = _codes(num_frames, groups, seed=num_frames, batch=2)
        with torch.no_grad():
            expected = hf(codes.transpose(1, 2)).squeeze(1)
            got = ours(codes)
        assert got.shape == expected.shape == (2, 1920 * num_frames - 555)
        assert ours.num_samples(num_frames) == 1920 * num_frames - 555
        assert (expected.abs() < 1).float().mean() > 0.99, "comparison must not be dominated by clipping"
        cosine = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
        assert cosine >= 0.99999
        assert (got - expected).abs().max() <= 1e-4


def _stream(vocoder, codes: torch.Tensor, config: VocoderStreamConfig, seed: int) -> list[torch.Tensor]:
    """Push codes [F, Q] in random pieces (including empty ones); return every emitted chunk."""
    stream, gen, start, chunks = VocoderStream(vocoder, config), torch.Generator().manual_seed(seed), 0, []
    while start < len(codes):
        size = int(torch.randint(0, 2 * config.chunk_frames + 2, (1,), generator=gen))
        chunks += stream.push(codes[start : start + size])
        start += size
    return [*chunks, stream.finish()]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk_frames,first_chunk_frames", [(1, 3), (4, 1), (25, 5), (50, 7)])
def test_stream_equals_one_shot(name, chunk_frames, first_chunk_frames):
    _, ours = audio_like_pair(name)
    config = VocoderStreamConfig(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
    gen = torch.Generator().manual_seed(chunk_frames)
    # One length beyond the tiny config's 72-frame attention window, one short (maybe < first chunk).
    for num_frames in (int(torch.randint(75, 130, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))):
        codes = _codes(num_frames, ours.cfg.num_quantizers, seed=num_frames)[0]
        with torch.no_grad():
            expected = ours(codes[None])[0]
        chunks = _stream(ours, codes, config, seed=num_frames)
        streamed = torch.cat(chunks)
        assert streamed.shape == expected.shape == (1920 * num_frames - 555,)
        assert (streamed - expected).abs().max() <= 1e-5
        first, *later = chunk_schedule(config, num_frames)
        assert [c.numel() for c in chunks if c.numel()] == [1920 * first - 555] + [1920 * n for n in later]


@pytest.mark.parametrize("name", NAMES)
def test_batched_streams_at_different_offsets(name):
    """Rows of a state pool at different frame offsets (different valid attention context,
    left-padded to the pool's fixed context) decode in one batch; scatter_ stores each row's state."""
    _, ours = audio_like_pair(name)
    groups, window = ours.cfg.num_quantizers, ours.cfg.sliding_window
    histories = [_codes(n, groups, seed=n)[0] for n in (2, window + 3, 11)]
    new = _codes(4, groups, seed=99, batch=3)
    rows = torch.tensor([3, 0, 1])  # pool rows need not be in order
    with torch.no_grad():
        pool, expected, after = ours.new_state(4, padded=True), [], []
        for row, history, codes in zip(rows, histories, new, strict=True):
            state = ours.new_state()
            ours.decode(history[None], state)
            pool.scatter_(row[None], state)
            after.append(copy.deepcopy(state))
            expected.append(ours.decode(codes[None], after[-1])[0])
        batch = pool.gather(rows)
        got = ours.decode(new, batch)
        pool.scatter_(rows, batch)
    assert (got - torch.stack(expected)).abs().max() <= 1e-5
    for row, single in zip(rows, after, strict=True):
        kept = pool.gather(row[None])
        assert kept.num_frames == single.num_frames
        context = single.keys[0].shape[2]  # the row's valid slots: the last ``context`` of the pool's
        kv = zip(kept.keys + kept.values, single.keys + single.values, strict=True)
        pairs = [(a[..., -context:, :], b) for a, b in kv]
        pairs += list(zip(kept.conv + kept.trans, single.conv + single.trans, strict=True))
        for a, b in pairs:
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_decode_in_chunks_equals_one_shot():
    _, ours = audio_like_pair("uneven")
    codes = _codes(23, ours.cfg.num_quantizers, seed=5)[0]
    with torch.no_grad():
        expected = ours(codes[None])[0]
    assert (decode_in_chunks(ours, codes, chunk_frames=6) - expected).abs().max() <= 1e-5


def test_chunks_grow_geometrically_to_full_size():
    """At the default talker speed (2x real time) each chunk after the first is min(chunk_frames,
    max(first_chunk_frames, frames so far)): no chunk more than doubles the audio before it; the chunk
    kinds are the (width, fresh) pairs the schedule produces, each once."""
    default = VocoderStreamConfig()
    assert chunk_schedule(default, 90) == [5, 5, 10, 20, 25, 25]
    assert chunk_schedule(default, 33) == [5, 5, 10, 13]
    assert default.chunk_kinds() == [(5, True), (5, False), (10, False), (20, False), (25, False)]
    assert chunk_schedule(VocoderStreamConfig(chunk_frames=4, first_chunk_frames=3), 15) == [3, 3, 4, 4, 1]
    assert chunk_schedule(VocoderStreamConfig(chunk_frames=25, first_chunk_frames=25), 60) == [25, 25, 10]
    for chunk_frames, first_chunk_frames in [(1, 3), (4, 1), (25, 5), (50, 7), (25, 25), (64, 1)]:
        config = VocoderStreamConfig(chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
        sizes = chunk_schedule(config, 40 * chunk_frames + first_chunk_frames)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        kinds = [(n, start == 0) for n, start in zip(sizes[:-1], starts, strict=False)]  # (the last may be short)
        assert config.chunk_kinds() == list(dict.fromkeys(kinds))
        assert all(n <= max(first_chunk_frames, start) for n, start in zip(sizes[1:], starts[1:], strict=True))
        assert sizes[-6:-1] == [chunk_frames] * 5


def late_chunks(config: VocoderStreamConfig, speed: float, num_frames: int = 4000) -> int:
    """Chunks of a stream that arrive after the audio before them has played: the talker makes ``speed``
    frames while one plays (frame i is made at i / speed, in frame times), a chunk is out when its last
    frame is made, and playback starts when the first chunk is out."""
    ends = np.cumsum(chunk_schedule(config, num_frames))
    arrivals, due = ends / speed, ends[0] / speed + np.concatenate([[0], ends[:-1]])
    return int((arrivals > due + 1e-9).sum())


@pytest.mark.parametrize("speed", [1.1, 1.25, 1.5, 2.0, 3.0])
def test_playback_never_runs_dry_while_the_talker_keeps_its_speed(speed):
    """At the talker speed the schedule assumes no chunk comes late, the widths are multiples of the first
    chunk's (a few graph shapes) and grow to full ones; the schedule for 2x real time, with a talker at
    1.25x, runs dry."""
    for chunk_frames, first in [(25, 5), (25, 3), (50, 7), (4, 1)]:
        config = VocoderStreamConfig(chunk_frames=chunk_frames, first_chunk_frames=first, talker_speed=speed)
        sizes = chunk_schedule(config, 4000)
        assert late_chunks(config, speed) == 0, (chunk_frames, first, sizes)
        assert all(n % first == 0 or n == chunk_frames for n in sizes[:-1])
        assert sizes[-2] == chunk_frames
    assert late_chunks(VocoderStreamConfig(), 1.25) > 0
    assert late_chunks(VocoderStreamConfig(talker_speed=1.25), 1.25) == 0


def test_stream_config_rejects_empty_chunks():
    with pytest.raises(ValueError, match="chunk_frames"):
        VocoderStreamConfig(chunk_frames=0)
    with pytest.raises(ValueError, match="talker_speed must be > 1"):
        VocoderStreamConfig(talker_speed=1.0)
