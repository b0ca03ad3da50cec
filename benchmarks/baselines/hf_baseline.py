"""HF transformers baseline on the same machine, config and work as ours: random weights, no checkpoint.

    python benchmarks/baselines/hf_baseline.py SKELETON_DIR --out DIR [--option attn_implementation=sdpa ...]
    python benchmarks/baselines/hf_baseline.py /tmp/tiny --device cpu --out DIR --text-tokens 2,6 ...

Builds ``Qwen3OmniMoeForConditionalGeneration`` from the directory's config.json directly on the
device in the model dtype (bf16 on CUDA: ~70 GB, never an fp32 copy), gives every parameter the
same kind of random values as ours (omniwalk's ``randomize``) and times, with ``generate``:

    text ITL   thinker, greedy, EOS masked (min_new_tokens = max_new_tokens), batches of requests
               with micro.py's prompts (left-padded): time per token after the first
               = (t(n2) - t(n1)) / (n2 - n1)
    s2s        generate(return_audio=True), greedy thinker and talker (HF then makes its code
               predictor greedy too): 4 s of speech-like audio -> 40 text tokens + 50 frames (4 s of
               speech), as ``omniwalk bench``'s s2s path; RTF = seconds / output audio seconds

``--option`` goes to HF's ``_from_config`` (``attn_implementation``, ``experts_implementation``).
Prompt ids come from omniwalk's processor (equal to HF's, tested) and audio features from our
log-mel, as in the HF parity tests; only ``generate`` is timed. A process of its own: it never
builds our model. Writes ``hf_baseline.json`` and ``hf_baseline.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import (  # noqa: E402
    add_option_argument,
    int_list,
    machine,
    markdown_table,
    prompt_text,
    timed_seconds,
    write_report,
)

from omniwalk.bench.workload import speech_like  # noqa: E402
from omniwalk.media.mel import log_mel  # noqa: E402
from omniwalk.models.common.checkpoint.loader import randomize  # noqa: E402
from omniwalk.models.common.processing.chat import ChatProcessor, Prompt  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig  # noqa: E402
from omniwalk.models.qwen3_omni.family import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from omniwalk.models.qwen3_omni.processing.media_inputs import measure  # noqa: E402
from omniwalk.tokenizer import Tokenizer  # noqa: E402

OUTPUT_RATE = 24000  # Code2Wav's sample rate
S2S_TEXT = "Please answer in detail."  # omniwalk bench's s2s request text


def build_hf(model_dir: str, device, dtype: torch.dtype, options: dict, seed: int = 0):
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    cfg = Qwen3OmniMoeConfig.from_pretrained(model_dir)
    # NOTE: HF bug workaround (reference §9.6): the talker's get_rope_index reads audio_config.
    cfg.talker_config.audio_config = cfg.thinker_config.audio_config
    with torch.device(device):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(cfg, dtype=dtype, **options).eval()
    randomize(model, seed)  # HF's init leaves constants (norms, biases) and possibly garbage
    return model


class Prompts:
    """omniwalk's prompt processing without its model: messages -> ``Prompt`` (ids, media items)."""

    def __init__(self, model_dir: str):
        self.cfg = Qwen3OmniConfig.from_hf(model_dir)
        self.processor = ChatProcessor(self.cfg, Tokenizer.from_dir(model_dir), DEFAULT_SYSTEM_PROMPT)

    def __call__(self, messages: list[dict]) -> Prompt:
        ids, parts = self.processor.tokenize(messages)
        return self.processor.build(ids, [measure(part, self.cfg.audio.n_window) for part in parts])


def left_padded(rows: list[list[int]], pad: int, device) -> dict:
    """Token id rows -> HF inputs, left-padded to one length (pads masked out)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def median_run(fn, device, repeats: int):
    """(last output, median seconds) of ``repeats`` synchronised runs."""
    runs = [timed_seconds(fn, device) for _ in range(repeats)]
    return runs[-1][0], statistics.median(s for _, s in runs)


@torch.inference_mode()
def bench_text(model, prompts: Prompts, args, device) -> list[dict]:
    n1, n2 = args.text_tokens
    pad = prompts.cfg.tokens.im_end
    rows = []
    for b in args.batches:
        messages = [[{"role": "user", "content": prompt_text(i, args.prompt_words)}] for i in range(b)]
        inputs = left_padded([prompts(m).token_ids for m in messages], pad, device)

        def generate(n: int):
            kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)
            return model.thinker.generate(**inputs, **kwargs)

        generate(max(n1, n2))  # warm-up: the longest timed run once (a 2-token one left the first timed run slow)
        times = {}
        for n in (n1, n2):
            out, times[n] = median_run(lambda: generate(n), device, args.repeats)
            if out.shape[1] - inputs["input_ids"].shape[1] != n:
                raise RuntimeError(f"HF generated {out.shape[1] - inputs['input_ids'].shape[1]} tokens, not {n}")
        itl = (times[n2] - times[n1]) / (n2 - n1)
        rows.append(dict(batch=b, n1=n1, t1_s=times[n1], n2=n2, t2_s=times[n2], itl_ms=itl * 1e3, tok_s=b / itl))
        print(f"HF text B={b:3d}: {itl * 1e3:8.2f} ms/token after the first, {b / itl:8.1f} tok/s")
    return rows


def s2s_inputs(prompts: Prompts, seconds: float, device, dtype) -> dict:
    wave = speech_like(seconds, seed=0)
    content = [{"type": "audio", "audio": wave}, {"type": "text", "text": S2S_TEXT}]
    prompt = prompts([{"role": "user", "content": content}])
    features, frames = log_mel([torch.from_numpy(wave)])
    ids = torch.tensor([prompt.token_ids], device=device)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "input_features": features.to(device, dtype),
        "feature_attention_mask": (torch.arange(features.shape[-1])[None] < frames[:, None]).long().to(device),
    }


@torch.inference_mode()
def bench_s2s(model, prompts: Prompts, args, device, dtype) -> dict:
    inputs = s2s_inputs(prompts, args.audio_seconds, device, dtype)
    speakers = prompts.cfg.talker.speaker_ids
    voice = "ethan" if "ethan" in speakers else next(iter(speakers))  # omniwalk's default voice

    def generate(tokens: int, frames: int):
        return model.generate(
            **inputs,
            speaker=voice,
            thinker_max_new_tokens=tokens,
            thinker_min_new_tokens=tokens,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=frames + 1,  # the last group-0 code never gets its residual codes
            talker_min_new_tokens=frames + 1,
        )

    generate(args.s2s_tokens, args.s2s_frames)  # warm-up: the timed work once (a short one left the first run slow)
    (ids, wav), seconds = median_run(lambda: generate(args.s2s_tokens, args.s2s_frames), device, args.repeats)
    audio_s = wav.numel() / OUTPUT_RATE
    row = dict(
        prompt_tokens=inputs["input_ids"].shape[1],
        text_tokens=ids.shape[1] - inputs["input_ids"].shape[1],
        audio_s=audio_s,
        seconds=seconds,
        rtf=seconds / audio_s,
    )
    print(f"HF s2s: {row['text_tokens']} tokens + {audio_s:.2f} s of audio in {seconds:.2f} s, RTF {row['rtf']:.3f}")
    return row


def report(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# HF transformers baseline",
        "",
        f"{m['device']}, torch {m['torch']}, transformers {results['transformers']}; {results['implementations']}; "
        f"model built in {results['build_s']:.1f} s; medians of {results['args']['repeats']} runs after a warm-up",
    ]
    if results.get("text"):
        columns = ["batch", "n1", "t1_s", "n2", "t2_s", "itl_ms", "tok_s"]
        lines += ["", "## Thinker decode (greedy, EOS masked)", ""]
        lines.append(markdown_table(columns, [[r[c] for c in columns] for r in results["text"]]))
    if results.get("s2s"):
        columns = list(results["s2s"])
        lines += ["", f"## s2s, B=1 ({results['args']['audio_seconds']:g} s of audio in)", ""]
        lines.append(markdown_table(columns, [[results["s2s"][c] for c in columns]]))
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint or weightless skeleton directory (its config.json is used)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", help="default bfloat16 on CUDA, float32 on the CPU")
    add_option_argument(p, "HF's _from_config")
    p.add_argument("--batches", type=int_list, default=[1, 8], help="text ITL batch sizes")
    p.add_argument("--text-tokens", type=int_list, default=[8, 40], help="n1,n2: the two generate lengths")
    p.add_argument("--prompt-words", type=int, default=24, help="words of each text request (as micro.py)")
    p.add_argument("--s2s-tokens", type=int, default=40)
    p.add_argument("--s2s-frames", type=int, default=50)
    p.add_argument("--audio-seconds", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-s2s", action="store_true")
    return p.parse_args()


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()  # generation-flag warnings on every call
    warnings.filterwarnings("ignore", message="Passing `repetition_penalty`")  # HF's talker, every s2s call
    args = parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    start = time.perf_counter()
    model = build_hf(args.model, device, dtype, dict(args.option))
    build_s = time.perf_counter() - start
    cfg = model.config
    results = {
        "machine": machine(device),
        "transformers": transformers.__version__,
        "implementations": {
            "attention": cfg._attn_implementation,
            "experts": getattr(cfg, "_experts_implementation", None),
        },
        "dtype": str(dtype),
        "build_s": build_s,
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "option")} | {"option": dict(args.option)},
    }
    print(f"HF model built in {build_s:.1f} s ({results['implementations']})")
    prompts = Prompts(args.model)
    results["text"] = bench_text(model, prompts, args, device)
    write_report(args.out, "hf_baseline", results, report(results))
    if not args.skip_s2s:
        results["s2s"] = bench_s2s(model, prompts, args, device, dtype)
    if device.type == "cuda":
        results["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    write_report(args.out, "hf_baseline", results, report(results))
    print(report(results))


if __name__ == "__main__":
    main()
