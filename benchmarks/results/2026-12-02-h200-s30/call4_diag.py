"""Session 30, device call 4: why tests/test_dit_gpu.py's fp32 velocity check failed (fast vs reference,
max abs 0.022 over padded rows of three lengths and times). Prints, for the 7B token2wav DiT with the
test's weights: fast vs reference and reference vs itself with x moved by one fp32 ulp (the field's own
sensitivity), for the padded batch and for one unpadded row; the bf16 pair's cosine."""

import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "tests")
import test_dit_gpu as t  # noqa: E402

from omniwalk.models.qwen2_5_omni.networks.dit import block_masks  # noqa: E402

reference, variants, speaker = t.build_models()
cfg = reference.cfg.dit
g = torch.Generator().manual_seed(5)
for lengths in ([144, 96, 50], [144, 144, 144], [144]):
    total = 144
    rows = [
        reference.dit.condition_rows(speaker, torch.randint(0, cfg.num_embeds, (n // 2,), generator=g).cuda())
        for n in lengths
    ]
    padded = torch.stack([F.pad(r, (0, 0, 0, total - r.shape[1])) for r in rows])
    conditions = torch.cat([padded[:, 0], padded[:, 1]])
    x = torch.randn(len(lengths), total, cfg.mel_dim, generator=g).cuda()
    tt = torch.linspace(0.05, 0.95, len(lengths), device="cuda")
    masks = block_masks(cfg, lengths * 2, total, "cuda")
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            ref = variants[dtype, False].dit.velocity(x, tt, conditions, masks, 0.5)
            ours = variants[dtype, True].dit.velocity(x, tt, conditions, masks, 0.5)
            moved = variants[dtype, False].dit.velocity(x * (1 + 2**-23), tt, conditions, masks, 0.5)
            for i, n in enumerate(lengths):
                d, s = (ours[i, :n] - ref[i, :n]).abs().max().item(), (moved[i, :n] - ref[i, :n]).abs().max().item()
                print(
                    f"{lengths} {dtype} row {i}: |fast-ref| {d:.3g}  |ref(x+ulp)-ref| {s:.3g}  "
                    f"cos {t._cosine(ours[i, :n], ref[i, :n]):.7f}  |ref| {ref[i, :n].abs().max().item():.3g}"
                )
