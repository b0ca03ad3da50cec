"""The encoders' padded layouts (what their CUDA graphs record) on the CPU: bucket choice, padding,
and real rows equal to the unpadded forward. Replay itself is tested in test_encoder_graphs_gpu.py."""

import pytest
import torch
from helpers.hf_oracle import config_dict

from omniwalk.engine.batch_stage import BatchStage, BatchStageConfig
from omniwalk.engine.packed_graphs import Bucket, layout_buckets, pad_layout, padded_lengths, pick_bucket
from omniwalk.models.common.checkpoint.loader import randomize
from omniwalk.models.common.programs.encoder_programs import AudioEncoderProgram
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder, attention_windows, audio_output_lengths
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder
from omniwalk.models.qwen3_omni.programs.encoder_programs import MIN_COMMON_FRAME_PATCHES, VisionEncoderProgram

WINDOW, CHUNK = 104, 13  # full-size audio: attention window and one chunk (1 s), in tokens


def test_bucket_rule_at_full_size():
    audio = layout_buckets(8192, WINDOW, CHUNK)
    assert [(b.num_tokens, b.num_segments) for b in audio if b.num_tokens in (256, 8192)] == [
        (256, 4),
        (256, 16),
        (256, 64),
        (8192, 64),
        (8192, 256),
        (8192, 1024),
    ]
    assert len(audio) == 18 and {b.max_seqlen for b in audio} == {WINDOW}
    vision = layout_buckets(8192, None, MIN_COMMON_FRAME_PATCHES)
    assert len(vision) == 15
    assert [(b.num_segments, b.max_seqlen) for b in vision if b.num_tokens == 8192] == [
        (1, 8192),
        (4, 8192),
        (16, 2048),
        (64, 512),
    ]
    assert layout_buckets(0, WINDOW, CHUNK) == [] and layout_buckets(128, None, 256) == []


def _audio_windows(seconds: list[float]) -> list[int]:
    return attention_windows([audio_output_lengths(int(100 * s)) for s in seconds], WINDOW)


@pytest.mark.parametrize(
    "seconds,bucket",
    [
        ([5], (256, 4)),  # 65 tokens in one window
        ([30], (512, 4)),  # 390 tokens in windows of 104, 104, 104, 78
        ([5] * 32, (4096, 64)),  # 2080 tokens: just over 2048
        ([0.05] * 70, (1024, 256)),  # 70 one-token clips: too many segments for 256 and 512 tokens
        ([600], None),  # 7800 tokens in 75 windows: over a 4096-token cap
    ],
)
def test_audio_bucket_choice(seconds, bucket):
    lengths = _audio_windows(seconds)
    chosen = pick_bucket(layout_buckets(4096, WINDOW, CHUNK), lengths)
    assert (chosen and (chosen.num_tokens, chosen.num_segments)) == bucket
    if bucket is None:
        assert pick_bucket(layout_buckets(8192, WINDOW, CHUNK), lengths) == Bucket(8192, 256, WINDOW)


@pytest.mark.parametrize(
    "grids,bucket",
    [
        ([(1, 28, 28)], (1024, 1)),  # a 448x448 image
        ([(1, 28, 28)] * 5, (4096, 16)),  # 3920 patches
        ([(6, 20, 36)], (8192, 16)),  # a video: 6 frame groups of 720 patches
        ([(1, 60, 50), (1, 20, 10), (1, 20, 10), (1, 20, 10), (1, 20, 10)], None),  # 5 segments, one of 3000
        ([(1, 100, 100)], None),  # 10000 patches
    ],
)
def test_vision_bucket_choice(grids, bucket):
    lengths = [h * w for t, h, w in grids for _ in range(t)]
    chosen = pick_bucket(layout_buckets(8192, None, MIN_COMMON_FRAME_PATCHES), lengths)
    assert (chosen and (chosen.num_tokens, chosen.num_segments)) == bucket


def test_padded_lengths_keep_real_segments_and_cut_the_padding():
    bucket = Bucket(2048, 4, 2048)  # pad pieces of 1024
    out = padded_lengths([700, 100, 48], bucket)
    assert out == [700, 100, 48, 1024, 176, 0]
    assert len(out) == bucket.num_slots and sum(out) == bucket.num_tokens
    audio = padded_lengths([65], Bucket(256, 4, WINDOW))
    assert audio == [65, 104, 87, 0, 0, 0, 0] and len(audio) == Bucket(256, 4, WINDOW).num_slots


def _tiny_cfg():
    return Qwen3OmniConfig.from_hf(config_dict("tiny"))


def _garbage_padding(inputs: dict, num_real: int) -> dict:
    """The same layout with padding rows of large random values: they must not reach real rows."""
    g = torch.Generator().manual_seed(7)
    out = dict(inputs)
    for name in ("x", "cos", "sin"):
        if name in out:
            x = out[name].clone()
            x[num_real:] = torch.randn(x[num_real:].shape, generator=g) * 100
            out[name] = x
    return out


def _padded_layouts(program, lengths: list[int], rows: dict) -> tuple:
    """The layout's bucket, and the layout padded to it: with pad values, and with garbage padding."""
    bucket = pick_bucket(program.graphs.buckets, lengths)
    inputs = pad_layout(bucket, lengths, rows, program.graphs.specs)
    assert bucket.num_tokens > rows["x"].shape[0]  # there is padding to test
    return bucket, (inputs, _garbage_padding(inputs, rows["x"].shape[0]))


@pytest.mark.parametrize("backend", ["reference", "masked"])
@torch.no_grad()
def test_audio_padded_layout_equals_unpadded(backend):
    encoder = AudioEncoder(_tiny_cfg().audio, backend).eval()
    randomize(encoder, 3)
    program = AudioEncoderProgram(encoder, "cpu", torch.float32, graph_max_tokens=1024)
    frames = [1234, 57, 401, 100, 9, 260]
    features = torch.randn(len(frames), 128, max(frames), generator=torch.Generator().manual_seed(1))
    expected = encoder(features, frames)

    x = encoder.embed(features, frames)
    bucket, layouts = _padded_layouts(program, encoder.segment_lengths(frames), {"x": x})
    assert layouts[0]["cu_seqlens"][-1] == layouts[0]["cu_seqlens"][-2]  # empty segments
    for padded in layouts:
        out = encoder.encode(**padded, max_seqlen=bucket.max_seqlen)[: x.shape[0]]
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "masked"])
@torch.no_grad()
def test_vision_padded_layout_equals_unpadded(backend):
    encoder = VisionEncoder(_tiny_cfg().vision, backend).eval()
    randomize(encoder, 4)
    program = VisionEncoderProgram(encoder, "cpu", torch.float32, graph_max_tokens=2048)
    grids = [(1, 6, 10), (1, 2, 2), (3, 8, 6), (1, 16, 2), (1, 12, 12)]  # images and a video
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), encoder.cfg.patch_dim)
    expected = encoder(pixels, grids)

    x, cos, sin = encoder.embed(pixels, grids)
    bucket, layouts = _padded_layouts(program, encoder.segment_lengths(grids), {"x": x, "cos": cos, "sin": sin})
    rows = x.shape[0] // 4
    for padded in layouts:
        main, deepstack = encoder.encode(**padded, max_seqlen=bucket.max_seqlen)
        torch.testing.assert_close(main[:rows], expected.embeddings, rtol=1e-6, atol=1e-6)
        assert len(deepstack) == len(expected.deepstack) == 3
        for mine, theirs in zip(deepstack, expected.deepstack, strict=True):
            torch.testing.assert_close(mine[:rows], theirs, rtol=1e-6, atol=1e-6)


def test_encoder_stage_reports_graph_counters_and_cpu_stays_eager():
    encoder = AudioEncoder(_tiny_cfg().audio).eval()
    program = AudioEncoderProgram(encoder, "cpu", torch.float32, graph_max_tokens=0)  # as build_stages on CPU
    stage = BatchStage("audio_encoder", program, BatchStageConfig())
    assert stage.capture_graphs("pool") == "pool"  # nothing to capture: the pool passes through
    features = torch.randn(1, 128, 300)
    assert torch.equal(program.encode(features, [300]), encoder(features, [300]))
    assert stage.stats() == {"requests": 0, "batch_size": 0, "graph_replays": 0, "eager_calls": 0}


@pytest.mark.parametrize("family", ["qwen3_omni", "qwen2_5_omni"])
@torch.no_grad()
def test_audio_program_replays_the_layers_and_finishes_eagerly(monkeypatch, family):
    """The shared audio program with graphs on (a stand-in replay of the padded layout on the CPU): each
    family's encoder rows as its unpadded forward (Qwen2.5-Omni's per-clip pooling runs after the replay);
    a layout over every bucket runs eagerly, counted."""
    from helpers.replay import EagerReplay

    from omniwalk.engine import packed_graphs

    monkeypatch.setattr(packed_graphs, "KeyedGraphs", EagerReplay)
    if family == "qwen3_omni":
        encoder = AudioEncoder(_tiny_cfg().audio).eval()
    else:
        from helpers.qwen2_5_oracle import config_dict as qwen2_5_config

        from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
        from omniwalk.models.qwen2_5_omni.networks.audio_encoder import AudioEncoder as Qwen25AudioEncoder

        encoder = Qwen25AudioEncoder(Qwen25OmniConfig.from_hf(qwen2_5_config("tiny")).audio).eval()
    randomize(encoder, 5)
    program = AudioEncoderProgram(encoder, "cpu", torch.float32, graph_max_tokens=1024)
    program.capture_graphs()
    for frames, replayed in (([1234, 57, 401], True), ([8000, 8000], False)):  # (the second: over 1024 tokens)
        features = torch.randn(len(frames), 128, max(frames), generator=torch.Generator().manual_seed(6))
        stats = program.stats()
        out = program.encode(features, frames)
        torch.testing.assert_close(out, encoder(features, frames), rtol=1e-6, atol=1e-6)
        assert out.shape[0] == sum(encoder.output_lengths(frames))
        after = program.stats()
        assert after["graph_replays"] - stats["graph_replays"] == replayed
        assert after["eager_calls"] - stats["eager_calls"] == (not replayed)


@pytest.mark.parametrize("name", ["tiny", "uneven"])  # uneven: full attention at blocks 0 and 3 (an empty run)
@torch.no_grad()
def test_qwen2_5_vision_program_replays_window_runs(monkeypatch, name):
    """Qwen2.5-Omni's vision program with graphs on (a stand-in replay of the padded window layout on the
    CPU): each run of window-attention blocks replayed, the full-attention blocks between them eager on the
    real rows: the encoder's unpadded forward for images and a video; a layout over every bucket is eager."""
    from helpers.qwen2_5_oracle import config_dict as qwen2_5_config
    from helpers.replay import EagerReplay

    from omniwalk.engine import packed_graphs
    from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
    from omniwalk.models.qwen2_5_omni.networks.vision_encoder import VisionEncoder as Qwen25VisionEncoder
    from omniwalk.models.qwen2_5_omni.programs.encoder_programs import VisionEncoderProgram as Qwen25Program

    monkeypatch.setattr(packed_graphs, "KeyedGraphs", EagerReplay)
    encoder = Qwen25VisionEncoder(Qwen25OmniConfig.from_hf(qwen2_5_config(name)).vision).eval()
    randomize(encoder, 6)
    program = Qwen25Program(encoder, "cpu", torch.float32, graph_max_tokens=1024)
    program.capture_graphs()
    g = torch.Generator().manual_seed(7)
    for grids, replayed in (([(1, 8, 12), (2, 6, 6), (1, 10, 4)], True), ([(1, 40, 40)], False)):  # (1600 > 1024)
        pixels = torch.randn(sum(t * h * w for t, h, w in grids), encoder.cfg.patch_dim, generator=g)
        before = program.stats()
        out, expected = program.encode(pixels, grids), encoder(pixels, grids)
        torch.testing.assert_close(out.embeddings, expected.embeddings, rtol=1e-5, atol=1e-5)
        assert out.tokens_per_item == expected.tokens_per_item
        after = program.stats()
        assert after["graph_replays"] - before["graph_replays"] == replayed
        assert after["eager_calls"] - before["eager_calls"] == (not replayed)
    runs = encoder.window_runs()
    assert sum(g is not None for g in program.graphs) == sum(last > first for first, last in runs) >= 1
