"""CUDA graphs of the encoders' layer loops on the GPU machine (full-size encoders, random bf16
weights): a replay equals eager over the same padded layout bitwise, and through the programs
graphs on and off agree (the padded layout changes only rounding) and oversized calls run eagerly."""

import time

import pytest
import torch

from omniwalk.engine.packed_graphs import pad_layout, pick_bucket

pytestmark = pytest.mark.gpu

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
    assert off.stats() == {"graph_replays": 0, "eager_calls": 0}

    clip = _features([500], 5)
    graphed, eager = _ms(lambda: on.encode(clip, [500])), _ms(lambda: off.encode(clip, [500]))
    print(f"GPU-ENCODER-GRAPHS audio one 5 s clip: eager {eager:.2f} ms, graphs {graphed:.2f} ms")


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
    assert off.stats() == {"graph_replays": 0, "eager_calls": 0}

    image = _pixels(VISION_LAYOUTS[0], 5, on.encoder.cfg.patch_dim)
    graphed = _ms(lambda: on.encode(image, VISION_LAYOUTS[0]))
    eager = _ms(lambda: off.encode(image, VISION_LAYOUTS[0]))
    print(f"GPU-ENCODER-GRAPHS vision one 448x448 image: eager {eager:.2f} ms, graphs {graphed:.2f} ms")
