"""The encoders' padded layouts (what their CUDA graphs record) on the CPU: bucket choice, padding,
and real rows equal to the unpadded forward. Replay itself is tested on the GPU machine (below).

CUDA graphs of the encoders' layer loops on the GPU machine (full-size encoders, random bf16
weights): a replay equals eager over the same padded layout bitwise, and through the programs
graphs on and off agree (the padded layout changes only rounding) and oversized calls run eagerly."""

import time

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
    assert stage.stats() == {
        "requests": 0,
        "batch_size": 0,
        "items_encoded": 0,
        "items_skipped": 0,
        "graph_replays": 0,
        "eager_calls": 0,
    }


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
        from helpers.qwen2_5_omni import config_dict as qwen2_5_config

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
    from helpers.qwen2_5_omni import config_dict as qwen2_5_config
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


AUDIO_MAX_TOKENS, VISION_MAX_TOKENS = 2048, 4096
AUDIO_LAYOUTS = [[500], [500] * 7 + [1234], [3000, 37, 801], [100] * 20]  # mel frames per clip
VISION_LAYOUTS = [
    [(1, 28, 28)],  # a 448x448 image: 784 patches in the 1024-token bucket
    [(1, 28, 28), (1, 30, 40), (2, 20, 36)],  # two images and a video
    [(1, 16, 16)] * 6,  # six small images
    [(1, 32, 32)],  # exactly a bucket: no padding tokens
]


def _encoder(kind: str):
    from helpers.gpu_pairs import randomize_, real_config_dict

    from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
    from omniwalk.models.qwen3_omni.networks.audio_encoder import AudioEncoder
    from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder

    cfg = Qwen3OmniConfig.from_hf(real_config_dict())
    with torch.device("cuda"):
        if kind == "audio":
            encoder = AudioEncoder(cfg.audio, "torch_varlen")
        else:
            encoder = VisionEncoder(cfg.vision, "torch_varlen")
    encoder = encoder.to(torch.bfloat16).eval()
    randomize_(encoder, 0)
    return encoder


def _programs(kind: str, cls, max_tokens: int):
    """(graphs on, captured; graphs off) over one encoder."""
    encoder = _encoder(kind)
    on, off = cls(encoder, "cuda", torch.bfloat16, graph_max_tokens=max_tokens), cls(encoder, "cuda", torch.bfloat16)
    start = time.perf_counter()
    assert on.capture_graphs(None) is not None and off.capture_graphs(None) is None  # off: nothing captured
    took = time.perf_counter() - start
    print(f"GPU-ENCODER-GRAPHS {kind}: {len(on.graphs.buckets)} graphs up to {max_tokens} tokens in {took:.1f}s")
    return on, off


@pytest.fixture(scope="module")
def audio():
    from omniwalk.models.common.programs.encoder_programs import AudioEncoderProgram

    return _programs("audio", AudioEncoderProgram, AUDIO_MAX_TOKENS)


@pytest.fixture(scope="module")
def vision():
    from omniwalk.models.qwen3_omni.programs.encoder_programs import VisionEncoderProgram

    return _programs("vision", VisionEncoderProgram, VISION_MAX_TOKENS)


def _features(frames: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(len(frames), 128, max(frames), generator=g, device="cuda") * 0.5).to(torch.bfloat16)


def _pixels(grids, seed: int, patch_dim: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    num_patches = sum(t * h * w for t, h, w in grids)
    return torch.randn(num_patches, patch_dim, generator=g, device="cuda").to(torch.bfloat16)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _ms(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


@pytest.mark.gpu
@torch.inference_mode()
def test_audio_graph_replay_equals_eager_on_the_padded_layout(audio):
    on, _ = audio
    encoder = on.encoder
    for seed, frames in enumerate(AUDIO_LAYOUTS):
        features = _features(frames, seed)
        lengths = encoder.segment_lengths(frames)
        bucket = pick_bucket(on.graphs.buckets, lengths)
        x = encoder.embed(features, frames)
        eager = encoder.encode(**pad_layout(bucket, lengths, {"x": x}, on.graphs.specs), max_seqlen=bucket.max_seqlen)
        graphed = on.graphs.run(bucket, lengths, {"x": x})["out"]
        n = x.shape[0]
        equal = torch.equal(graphed[:n], eager[:n])
        print(f"GPU-ENCODER-GRAPHS audio {n} tokens in {bucket}: replay == eager {equal}")
        assert torch.isfinite(eager[:n]).all()
        assert equal


@pytest.mark.gpu
@torch.inference_mode()
def test_vision_graph_replay_equals_eager_on_the_padded_layout(vision):
    on, _ = vision
    encoder = on.encoder
    for seed, grids in enumerate(VISION_LAYOUTS):
        pixels = _pixels(grids, seed, encoder.cfg.patch_dim)
        lengths = encoder.segment_lengths(grids)
        bucket = pick_bucket(on.graphs.buckets, lengths)
        x, cos, sin = encoder.embed(pixels, grids)
        rows = {"x": x, "cos": cos, "sin": sin}
        padded = pad_layout(bucket, lengths, rows, on.graphs.specs)
        main, deepstack = encoder.encode(**padded, max_seqlen=bucket.max_seqlen)
        graphed = list(on.graphs.run(bucket, lengths, rows).values())
        n = x.shape[0] // 4
        equal = [torch.equal(g[:n], e[:n]) for g, e in zip(graphed, [main, *deepstack], strict=True)]
        print(f"GPU-ENCODER-GRAPHS vision {x.shape[0]} patches in {bucket}: replay == eager {equal}")
        assert torch.isfinite(main[:n]).all()
        assert all(equal) and len(equal) == 4


@pytest.mark.gpu
@torch.inference_mode()
def test_audio_program_graphs_on_vs_off(audio):
    on, off = audio
    before = on.stats()
    layouts = [*AUDIO_LAYOUTS, AUDIO_LAYOUTS[0]]  # the first graph replays twice: outputs must not alias
    features = [_features(frames, 10 + i) for i, frames in enumerate(layouts)]
    results = [(on.encode(f, frames), off.encode(f, frames)) for f, frames in zip(features, layouts, strict=True)]
    for frames, (a, b) in zip(layouts, results, strict=True):
        cos, err = _cosine(a, b), (a.float() - b.float()).abs().max().item()
        print(
            f"GPU-ENCODER-GRAPHS audio program {len(frames)} clips: graphs vs eager cosine {cos:.6f}, max abs {err:.3e}"
        )
        assert a.shape == b.shape and cos >= 0.999
    after = on.stats()
    assert after["graph_replays"] - before["graph_replays"] == len(layouts)
    assert after["eager_calls"] == before["eager_calls"]

    big = _features([30000], 99)  # 3900 tokens: over the 2048-token graphs
    assert torch.equal(on.encode(big, [30000]), off.encode(big, [30000]))  # both eager, unpadded
    assert on.stats()["eager_calls"] == before["eager_calls"] + 1
    assert off.stats() == {"items_encoded": 0, "items_skipped": 0, "graph_replays": 0, "eager_calls": 0}

    clip = _features([500], 5)
    graphed, eager = _ms(lambda: on.encode(clip, [500])), _ms(lambda: off.encode(clip, [500]))
    print(f"GPU-ENCODER-GRAPHS audio one 5 s clip: eager {eager:.2f} ms, graphs {graphed:.2f} ms")


@pytest.mark.gpu
@torch.inference_mode()
def test_vision_program_graphs_on_vs_off(vision):
    on, off = vision
    before = on.stats()
    layouts = [*VISION_LAYOUTS, VISION_LAYOUTS[0]]  # the first graph replays twice: outputs must not alias
    pixels = [_pixels(grids, 10 + i, on.encoder.cfg.patch_dim) for i, grids in enumerate(layouts)]
    results = [(on.encode(p, grids), off.encode(p, grids)) for p, grids in zip(pixels, layouts, strict=True)]
    for grids, (a, b) in zip(layouts, results, strict=True):
        assert a.tokens_per_item == b.tokens_per_item
        pairs = [(a.embeddings, b.embeddings), *zip(a.deepstack, b.deepstack, strict=True)]
        cosines = [_cosine(x, y) for x, y in pairs]
        print(f"GPU-ENCODER-GRAPHS vision program {grids}: graphs vs eager cosines {[f'{c:.6f}' for c in cosines]}")
        assert len(pairs) == 4 and all(x.shape == y.shape for x, y in pairs) and min(cosines) >= 0.999
    after = on.stats()
    assert after["graph_replays"] - before["graph_replays"] == len(layouts)
    assert after["eager_calls"] == before["eager_calls"]

    big_grids = [(1, 80, 60)]  # 4800 patches: over the 4096-token graphs
    big = _pixels(big_grids, 99, on.encoder.cfg.patch_dim)
    assert torch.equal(on.encode(big, big_grids).embeddings, off.encode(big, big_grids).embeddings)
    assert on.stats()["eager_calls"] == before["eager_calls"] + 1
    assert off.stats() == {"items_encoded": 0, "items_skipped": 0, "graph_replays": 0, "eager_calls": 0}

    image = _pixels(VISION_LAYOUTS[0], 5, on.encoder.cfg.patch_dim)
    graphed = _ms(lambda: on.encode(image, VISION_LAYOUTS[0]))
    eager = _ms(lambda: off.encode(image, VISION_LAYOUTS[0]))
    print(f"GPU-ENCODER-GRAPHS vision one 448x448 image: eager {eager:.2f} ms, graphs {graphed:.2f} ms")
