"""HF transformers baseline for Qwen2.5-Omni on the same machine, config and work as ``omniwalk bench``.

    python benchmarks/baselines/hf_baseline_qwen25.py SKELETON_DIR --out DIR [--paths s2t,i2t,s2s,i2s]
    python benchmarks/baselines/hf_baseline_qwen25.py /tmp/tiny25 --device cpu --out DIR --repeats 1

Builds ``Qwen2_5OmniForConditionalGeneration`` from the directory's config.json on the device (the
LMs and encoders in bf16 on CUDA, token2wav in fp32 as HF's ``generate`` runs it), random weights
as omniwalk's ``randomize``, and times one request's ``generate`` end to end per path at B = 1
(``omniwalk bench``'s presets, ``bench/workload.py``: the same inputs, text tokens and seconds of
speech out; greedy thinker and talker, EOS masked; speech = talker codes + one-shot token2wav with
the checkpoint's default 10 ODE steps). The talker gets ``bad_words_ids`` for the codes token2wav
cannot speak (random weights draw them, HF's token2wav fails on them; omniwalk suppresses them).
Prompt ids and media come from omniwalk's processor (equal to HF's, tested). Writes
``hf_baseline_qwen25.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import machine, markdown_table, timed_seconds, write_report  # noqa: E402

from omniwalk.bench.workload import photo_like, presets_for, speech_like  # noqa: E402
from omniwalk.media.mel import log_mel  # noqa: E402
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig  # noqa: E402
from omniwalk.models.qwen2_5_omni.family import read_speakers  # noqa: E402
from omniwalk.models.qwen2_5_omni.networks.token2wav import SAMPLE_RATE  # noqa: E402
from omniwalk.models.qwen2_5_omni.processing.chat import DEFAULT_SYSTEM_PROMPT, ChatProcessor  # noqa: E402
from omniwalk.models.qwen2_5_omni.processing.media_inputs import measure, vision_pixels  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.loader import randomize  # noqa: E402
from omniwalk.tokenizer import Tokenizer  # noqa: E402

TEXT = "Please answer in detail."  # omniwalk bench's request text


def build_hf(model_dir: str, device, dtype: torch.dtype):
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    cfg = Qwen2_5OmniConfig.from_pretrained(model_dir)
    with torch.device(device):
        model = Qwen2_5OmniForConditionalGeneration._from_config(cfg, dtype=dtype).eval()
    randomize(model, 0)
    model.token2wav.float()
    model.speaker_map = {name.capitalize(): entry for name, entry in read_speakers(model_dir).items()}
    return model


def inputs_for(path: str, cfg: Qwen25OmniConfig, processor: ChatProcessor, device, dtype) -> dict:
    """One request's HF inputs for a bench path (its speech / image and text)."""
    work = presets_for("qwen2.5-omni")[path]
    content = [{"type": "text", "text": TEXT}]
    if path.startswith("s"):
        content.insert(0, {"type": "audio", "audio": speech_like(work.audio_seconds, seed=0)})
    if path.startswith("i"):
        content.insert(0, {"type": "image", "image": photo_like(*work.image_size, seed=0)})
    ids, parts = processor.tokenize([{"role": "user", "content": content}])
    prompt = processor.build(ids, [measure(part) for part in parts])
    ids = torch.tensor([prompt.token_ids], device=device)
    # one masked token in front keeps HF's mask, so its talker runs the batched path (see tests)
    pad = torch.tensor([[cfg.tokens.im_end]], device=device)
    out = {"input_ids": torch.cat([pad, ids], 1), "attention_mask": torch.cat([pad * 0, torch.ones_like(ids)], 1)}
    for item in prompt.items:
        if item.kind == "audio":
            features, frames = log_mel([torch.from_numpy(item.data["audio"])], zero_tail=True)
            out["input_features"] = features.to(device, dtype)
            out["feature_attention_mask"] = (torch.arange(features.shape[-1])[None] < frames[:, None]).long().to(device)
        else:
            out["thinker_pixel_values"] = vision_pixels(item, device).to(dtype)
            out["image_grid_thw"] = torch.tensor([item.grid_thw], device=device)
    return out


@torch.inference_mode()
def bench_path(model, path: str, inputs: dict, cfg: Qwen25OmniConfig, args, device) -> dict:
    work = presets_for("qwen2.5-omni")[path]
    talker, num_codes = cfg.talker, cfg.token2wav.dit.num_embeds + 1
    bad = [[i] for i in range(num_codes, talker.text.vocab_size) if i not in (talker.codec_pad, talker.codec_eos)]

    def generate(tokens: int, codes: int):
        kw = dict(thinker_max_new_tokens=tokens, thinker_min_new_tokens=tokens, thinker_do_sample=False)
        if not work.speaks:
            return model.generate(**inputs, generation_mode="text", **kw), None
        return model.generate(
            **inputs,
            speaker="Ethan",
            talker_do_sample=False,
            talker_max_new_tokens=codes,
            talker_min_new_tokens=codes,
            talker_bad_words_ids=bad,
            **kw,
        )

    # Warm-up: the whole work once (a 2-token warm-up leaves the first timed run 2-3x slower than the rest,
    # which inflates a median of few runs).
    generate(work.text_tokens, work.audio_frames)
    runs = [timed_seconds(lambda: generate(work.text_tokens, work.audio_frames), device) for _ in range(args.repeats)]
    (_, wav), seconds = runs[-1][0], statistics.median(s for _, s in runs)
    row = dict(
        path=path,
        prompt_tokens=inputs["input_ids"].shape[1] - 1,
        text_tokens=work.text_tokens,
        e2e_s=seconds,
        runs_s=[round(s, 4) for _, s in runs],
    )
    if wav is not None:
        row.update(audio_s=wav.numel() / SAMPLE_RATE, rtf=seconds / (wav.numel() / SAMPLE_RATE))
    print(f"HF {path} B=1: {row}", flush=True)
    return row


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint or weightless skeleton directory (its config.json is used)")
    p.add_argument("--paths", default="s2t,i2t,s2s,i2s", help="bench paths, each timed at B = 1")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per path (median), after a full warm-up run")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    model = build_hf(args.model, device, dtype)
    cfg = Qwen25OmniConfig.from_hf(args.model)
    processor = ChatProcessor(cfg, Tokenizer.from_dir(args.model), DEFAULT_SYSTEM_PROMPT)
    build_s = time.perf_counter() - start
    results = {
        "machine": machine(device),
        "transformers": transformers.__version__,
        "dtype": str(dtype),
        "build_s": build_s,
        "args": vars(args) | {"out": str(args.out)},
        "paths": [],
    }
    works = {k: dataclasses.asdict(w) for k, w in presets_for("qwen2.5-omni").items()}
    for path in args.paths.split(","):
        inputs = inputs_for(path, cfg, processor, device, dtype)
        results["paths"].append(bench_path(model, path, inputs, cfg, args, device))
        results["works"] = {k: works[k] for k in args.paths.split(",")}
        columns = ["path", "prompt_tokens", "text_tokens", "e2e_s", "audio_s", "rtf"]
        table = markdown_table(columns, [[r.get(c, "") for c in columns] for r in results["paths"]])
        write_report(args.out, "hf_baseline_qwen25", results, f"# HF transformers Qwen2.5-Omni, B=1\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
