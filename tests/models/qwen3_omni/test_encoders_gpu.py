"""bf16 parity of the full-size audio and vision encoders vs HF bf16 (GPU machine only)."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@torch.inference_mode()
def test_audio_encoder_full_size_bf16_matches_hf():
    from helpers.gpu_pairs import audio_pair, cosine, report

    from omniwalk.media.mel import log_mel

    ours, hf = audio_pair()
    g = torch.Generator(device="cuda").manual_seed(1)
    waves = [torch.randn(n, generator=g, device="cuda") * 0.1 for n in (16000 * 5, 16000 * 13 + 123, 8000)]
    features, frames = log_mel(waves)
    out = ours(features, frames.tolist())
    packed = torch.cat([features[i, :, : int(n)] for i, n in enumerate(frames)], dim=1)
    ref = hf(packed.to(torch.bfloat16), feature_lens=frames).last_hidden_state
    assert out.shape == ref.shape
    assert report("audio encoder", cosine(out, ref)) >= 0.999


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
