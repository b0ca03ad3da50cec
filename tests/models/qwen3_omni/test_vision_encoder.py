"""Native vision encoder vs HF's Qwen3-Omni visual tower (tiny random checkpoints, fp32 CPU).

On the GPU machine: the full-size vision encoder's bf16 parity with HF bf16."""

import numpy as np
import pytest
import torch
from helpers.hf_oracle import assert_parity, config_dict, hf_checkpoint, hf_model
from helpers.media_samples import gradient_image
from helpers.processor_oracle import hf_image_processor
from helpers.single_request import video_patches

from omniwalk.media.patches import image_patches, resize_image
from omniwalk.models.common.checkpoint.weights import load_weights
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.vision_encoder import VisionEncoder


@pytest.fixture(scope="module", params=["tiny", "uneven"])
def encoders(request):
    name = request.param
    ours = VisionEncoder(Qwen3OmniConfig.from_hf(config_dict(name)).vision).eval()
    load_weights(ours, hf_checkpoint(name), prefix="thinker.visual.")
    return ours, hf_model(name).thinker.model.visual


def _assert_output_parity(ours, ref):
    assert_parity(ours.embeddings, ref.pooler_output)
    assert len(ours.deepstack) == len(ref.deepstack_features) > 0
    for mine, theirs in zip(ours.deepstack, ref.deepstack_features, strict=True):
        assert_parity(mine, theirs)


GRIDS = [(1, 6, 10), (2, 4, 4), (1, 2, 2), (3, 8, 6), (1, 16, 2)]  # images, videos, sizes off the table


@torch.no_grad()
def test_packed_items_match_hf(encoders):
    ours, visual = encoders
    pixels = torch.randn(
        sum(t * h * w for t, h, w in GRIDS), ours.cfg.patch_dim, generator=torch.Generator().manual_seed(0)
    )
    _assert_output_parity(ours(pixels, GRIDS), visual(pixels, grid_thw=torch.tensor(GRIDS)))


@torch.no_grad()
def test_packed_equals_one_at_a_time(encoders):
    ours, visual = encoders
    pixels = torch.randn(
        sum(t * h * w for t, h, w in GRIDS), ours.cfg.patch_dim, generator=torch.Generator().manual_seed(1)
    )
    packed = ours(pixels, GRIDS).split()
    start = 0
    for grid, (main, levels) in zip(GRIDS, packed, strict=True):
        count = grid[0] * grid[1] * grid[2]
        alone = ours(pixels[start : start + count], [grid])
        ref = visual(pixels[start : start + count], grid_thw=torch.tensor([grid]))
        assert_parity(main, alone.embeddings)
        assert_parity(main, ref.pooler_output)
        for mine, theirs in zip(levels, alone.deepstack, strict=True):
            assert_parity(mine, theirs)
        start += count


@torch.no_grad()
def test_real_image_and_video_end_to_end(encoders):
    ours, visual = encoders
    processor = hf_image_processor()
    image = gradient_image(100, 150)
    ref_in = processor(images=[image], return_tensors="pt")
    pixels, grid = image_patches(torch.from_numpy(resize_image(image)))
    frames = torch.from_numpy(np.stack([gradient_image(40, 60, seed=i) for i in range(3)]))
    video_pixels, video_grid = video_patches(frames)
    out = ours(torch.cat([pixels, video_pixels]), [grid, video_grid])
    ref = visual(torch.cat([ref_in["pixel_values"], video_pixels]), grid_thw=torch.tensor([grid, video_grid]))
    _assert_output_parity(out, ref)
    assert out.tokens_per_item == [grid[1] * grid[2] // 4, video_grid[0] * video_grid[1] * video_grid[2] // 4]


def test_parameter_names_mirror_checkpoint(encoders):
    ours = encoders[0]
    params = dict(ours.named_parameters())
    assert params["patch_embed.proj.weight"].dim() == 5
    assert {
        "pos_embed.weight",
        "blocks.0.attn.qkv.weight",
        "merger.ln_q.weight",
        "merger.mlp.0.weight",
        "merger_list.0.mlp.2.bias",
    } <= set(params)
    assert not list(ours.state_dict().keys() - set(params))


@pytest.mark.gpu
@torch.inference_mode()
def test_vision_encoder_full_size_bf16_matches_hf():
    from helpers.gpu_pairs import cosine, report, vision_pair

    from omniwalk.media.patches import image_patches, resize_image

    ours, hf = vision_pair()
    rng = torch.Generator().manual_seed(2)
    patches, grids = [], []
    for h, w in ((448, 448), (480, 640), (224, 320)):
        image = torch.randint(0, 256, (h, w, 3), generator=rng, dtype=torch.uint8).numpy()
        p, grid = image_patches(torch.from_numpy(resize_image(image)).cuda())
        patches.append(p)
        grids.append(grid)
    pixels = torch.cat(patches)
    out = ours(pixels, grids)
    ref = hf(pixels.to(torch.bfloat16), torch.tensor(grids, device="cuda"))
    assert report("vision encoder", cosine(out.embeddings, ref.pooler_output)) >= 0.999
    assert len(out.deepstack) == len(ref.deepstack_features) == 3
    for level, (a, b) in enumerate(zip(out.deepstack, ref.deepstack_features, strict=True)):
        assert report(f"vision deepstack {level}", cosine(a, b)) >= 0.999, level
