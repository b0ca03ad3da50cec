"""Video preprocessing and video prompt ids vs HF's real ``Qwen2VLVideoProcessor``.

HF's video processor needs torchvision, which cannot be installed beside the pinned CPU torch
used in CI; these tests run where torchvision exists (the GPU machine) and skip elsewhere. The
CPU suite covers the same maths against an explicit per-patch oracle (``test_video.py``).
"""

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from helpers.single_request import video_patches  # noqa: E402

SIZES = [(4, 64, 96), (5, 100, 150), (6, 360, 640), (2, 33, 47), (8, 720, 1280)]


def hf_video_processor():
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    # The Qwen3-Omni processor's video settings: 16-pixel patches, 2-frame groups, 2x2 merge,
    # mean/std 0.5, and its size override of 128..768 merged tokens per frame.
    return Qwen2VLVideoProcessor(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size={"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32},
    )


@pytest.mark.parametrize("num_frames, height, width", SIZES)
def test_video_patches_equal_hf_video_processor(num_frames, height, width):
    rng = np.random.default_rng(num_frames * height)
    frames = rng.integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    out = hf_video_processor()(videos=[frames], return_tensors="pt", do_sample_frames=False)
    pixels, grid = video_patches(torch.from_numpy(frames))
    assert list(grid) == out["video_grid_thw"][0].tolist()
    expected = out["pixel_values_videos"]
    assert pixels.shape == expected.shape
    err = (pixels.float() - expected.float()).abs()
    print(
        f"VIDEO-PARITY {num_frames}x{height}x{width}: grid {list(grid)} max abs {err.max():.2e} mean {err.mean():.2e}"
    )
    assert err.max() <= 1e-6  # the same uint8 resize kernel: only float rounding of the normalisation


@pytest.mark.parametrize("case", ["video", "audio_in_video"])
def test_video_prompt_ids_equal_hf_processor_with_real_video_processor(case):
    """Our measurement (decode, sample, resize, grid) + prompt layout vs HF's full processor."""
    from helpers.processor_oracle import CASES, hf_call, hf_processor, ours

    from omniwalk.models.qwen3_omni.processing.media_inputs import measure

    processor = hf_processor()
    stand_in, processor.video_processor = processor.video_processor, hf_video_processor()
    try:
        aiv = case == "audio_in_video"
        out = hf_call(CASES[case], aiv)
    finally:
        processor.video_processor = stand_in
    ids, parts = ours().tokenize(CASES[case])
    prompt = ours().build(ids, [measure(p, 50) for p in parts], use_audio_in_video=aiv)
    print(f"VIDEO-PROMPT {case}: grid {out['video_grid_thw'].tolist()} tokens {len(prompt.token_ids)}")
    assert prompt.token_ids == out["input_ids"][0].tolist()
