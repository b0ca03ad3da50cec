"""Encoder micro-benchmark on one GPU: ours vs HF on identical inputs and weights (full-size config).

    python benchmarks/engine/encoders.py --out results_dir

Times (median ms per call, CUDA events): audio encoder on 1/8/32 clips of 5 s (features
precomputed), vision encoder on 1/8/32 images of 448x448 (patches precomputed), and log-mel on
the GPU (ours, batched) vs HF's WhisperFeatureExtractor on the CPU (per call, the way the HF
processor runs). Prints a markdown table and writes it with the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers.gpu_pairs import audio_pair, cosine, vision_pair  # noqa: E402
from helpers.hf_oracle import whisper_extractor  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (harness.py)
from harness import median_ms  # noqa: E402

from omniwalk.media.mel import log_mel  # noqa: E402
from omniwalk.media.patches import image_patches, resize_image  # noqa: E402


def bench_audio(rows: list[dict]) -> None:
    ours, hf = audio_pair()
    fe = whisper_extractor()
    for n in (1, 8, 32):
        waves = [torch.randn(80000, device="cuda") * 0.1 for _ in range(n)]
        feats, frames = log_mel(waves)
        packed = torch.cat([feats[i, :, : int(f)] for i, f in enumerate(frames)], 1).to(torch.bfloat16)
        num_frames = frames.tolist()
        with torch.inference_mode():
            cos = cosine(ours(feats, num_frames), hf(packed, feature_lens=frames).last_hidden_state)
            ours_ms = median_ms(lambda: ours(feats, num_frames), "cuda", warmup=3, iters=10)
            hf_ms = median_ms(lambda: hf(packed, feature_lens=frames), "cuda", warmup=3, iters=10)
            mel_ms = median_ms(lambda: log_mel(waves), "cuda", warmup=3, iters=10)
        host = [w.cpu().numpy() for w in waves]
        extract = lambda: fe(host, sampling_rate=16000, padding=True, truncation=False, return_tensors="pt")  # noqa: E731
        hf_mel_ms = median_ms(extract, "cpu", warmup=1, iters=5)
        rows.append(
            dict(
                item="audio 5 s",
                batch=n,
                ours_ms=ours_ms,
                hf_ms=hf_ms,
                cosine=cos,
                mel_gpu_ms=mel_ms,
                mel_hf_cpu_ms=hf_mel_ms,
            )
        )


def bench_vision(rows: list[dict]) -> None:
    ours, hf = vision_pair()
    rng = np.random.default_rng(0)
    for n in (1, 8, 32):
        patches, grids = [], []
        for _ in range(n):
            image = rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)
            p, grid = image_patches(torch.from_numpy(resize_image(image)).cuda())
            patches.append(p)
            grids.append(grid)
        pixels, grid_t = torch.cat(patches), torch.tensor(grids, device="cuda")
        with torch.inference_mode():
            cos = cosine(ours(pixels, grids).embeddings, hf(pixels.to(torch.bfloat16), grid_t).pooler_output)
            ours_ms = median_ms(lambda: ours(pixels, grids), "cuda", warmup=3, iters=10)
            hf_ms = median_ms(lambda: hf(pixels.to(torch.bfloat16), grid_t), "cuda", warmup=3, iters=10)
        rows.append(dict(item="image 448x448", batch=n, ours_ms=ours_ms, hf_ms=hf_ms, cosine=cos))


def table(rows: list[dict]) -> str:
    lines = [
        "| input | batch | ours ms | HF ms | HF/ours | cosine | log-mel GPU ms | HF log-mel CPU ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mel = f"{r['mel_gpu_ms']:.2f} | {r['mel_hf_cpu_ms']:.1f}" if "mel_gpu_ms" in r else "- | -"
        lines.append(
            f"| {r['item']} | {r['batch']} | {r['ours_ms']:.2f} | {r['hf_ms']:.2f} | "
            f"{r['hf_ms'] / r['ours_ms']:.2f} | {r['cosine']:.5f} | {mel} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    rows: list[dict] = []
    bench_audio(rows)
    torch.cuda.empty_cache()
    bench_vision(rows)
    text = table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "encoders.json").write_text(
        json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
    )
    (args.out / "encoders.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
