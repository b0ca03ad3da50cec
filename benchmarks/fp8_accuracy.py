"""Where the FP8 thinker's logits error comes from: each weight group quantised alone, finer scale
blocks, and same-size random perturbations, on a deep random-weight thinker (CPU, fp32).

    PYTHONPATH=. python benchmarks/fp8_accuracy.py --out DIR [--layers 48 --hidden 512 --experts 32]

The thinker is the full-size config (``qwen3-omni-30b-a3b``) narrowed (hidden, heads, experts, their
width, vocabulary; depth, head size, top-k as configured) with ``randomize``'s weights, in fp32. A
variant replaces some weights W by their FP8 round trip ``dequantize(quantize(W, block))`` (exactly
what the FP8 reference path multiplies by, ``Fp8Linear.forward``) or by a perturbed copy; the
variant is fed the base model's own greedy ids (teacher forcing, ``fp8.py``'s accuracy) and each
step's logits are compared with the base model's: cosine (mean, min), argmax agreement, and the share
of routing decisions (token, MoE layer) that picked the same top-k experts as the base model.

Variants: ``fp8`` all decoder projections (attention q/k/v/o + experts: the ``--quantization fp8``
set), ``fp8 experts``, ``fp8 attention`` (and its halves ``fp8 q k``, ``fp8 v o``), ``fp8 1x128``
(scales per row and 128 columns: finer than Qwen's 128x128), ``noise`` (each weight times 1 + r·z,
z ~ N(0, 1), r the FP8 round trip's measured RMS relative error: same size, no rounding structure),
``bf16`` (weights rounded to bf16: the same model at bf16's 8 bits, for scale). The relative error
of the weights (RMS of (W' - W) / RMS of W) is printed with each.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when not installed
from omniwalk.layers.decoder import RowsKVCache  # noqa: E402
from omniwalk.layers.fp8 import dequantize, quantize  # noqa: E402
from omniwalk.models.common.networks.thinker import Thinker  # noqa: E402
from omniwalk.models.qwen3_omni import PRESETS  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig  # noqa: E402
from omniwalk.models.qwen3_omni.checkpoint.loader import randomize  # noqa: E402

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERTS = ("gate_up_proj", "down_proj")


def build(args) -> Thinker:
    cfg = Qwen3OmniConfig.from_hf(PRESETS["qwen3-omni-30b-a3b"])
    text = dataclasses.replace(
        cfg.text, hidden_size=args.hidden, num_hidden_layers=args.layers, num_experts=args.experts,
        num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 8),
        moe_intermediate_size=args.inter, intermediate_size=args.inter, vocab_size=args.vocab,
    )  # fmt: skip
    thinker = Thinker(text, cfg.tokens, 1)
    randomize(thinker, args.seed)
    return thinker.eval()


def weights(model: Thinker, groups: tuple[str, ...]):
    for name, p in model.model.layers.named_parameters():
        if p.dim() >= 2 and name.split(".")[-1] in groups or name.split(".")[-2] in groups:
            yield name, p


def fp8_round_trip(w: torch.Tensor, block) -> torch.Tensor:
    if w.dim() == 3 and w.shape[1] % 2 == 0 and block[0] > 1:  # (gate_up: gate and up quantised apart)
        return torch.cat([fp8_round_trip(half, block) for half in w.chunk(2, 1)], 1)
    return dequantize(*quantize(w, block), block, torch.float32)


def variant(base: Thinker, groups: tuple[str, ...], change) -> tuple[Thinker, float]:
    model = copy.deepcopy(base)
    err = ref = 0.0
    with torch.no_grad():
        for _, p in weights(model, groups):
            new = change(p.data)
            err += (new - p.data).square().sum().item()
            ref += p.data.square().sum().item()
            p.data.copy_(new)
    return model, (err / max(ref, 1e-30)) ** 0.5


@torch.no_grad()
def logits_run(model: Thinker, ids: torch.Tensor, steps: int, forced: torch.Tensor | None):
    """-> (logits [steps, vocab], the ids fed, each MoE layer call's top-k expert sets [tokens, k] in order)."""
    cfg = model.cfg
    cache = RowsKVCache(1, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32, "cpu",
                        ids.numel() + steps + 1)  # fmt: skip
    routes = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda m, i, o: routes.append(o.topk(cfg.num_experts_per_tok).indices))
        for layer in model.model.layers
        if hasattr(layer.mlp, "gate")
    ]
    logits = model(ids, torch.arange(ids.numel()), cache).logits[-1:]
    out, fed = [], []
    for t in range(steps):
        out.append(logits[0].float())
        token = forced[t : t + 1] if forced is not None else logits[0].argmax().view(1)
        fed.append(token)
        logits = model(token, torch.tensor([ids.numel() + t]), cache).logits
    for h in hooks:
        h.remove()
    return torch.stack(out), torch.cat(fed), routes


def same_routes(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Share of (token, MoE layer) routing decisions with the same set of top-k experts."""
    same = [(x.sort(-1).values == y.sort(-1).values).all(-1) for x, y in zip(a, b, strict=True)]
    return torch.cat(same).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8, help="query heads (key/value heads: 1 in 8, as configured)")
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--inter", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (intra-op threading: 7x slower here)")
    parser.add_argument("--variants", default="fp8,fp8 experts,fp8 attention,fp8 1x128,noise,bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    base = build(args)
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = [torch.randint(0, args.vocab, (16,), generator=g) for _ in range(args.prompts)]
    refs = [logits_run(base, ids, args.steps, None) for ids in prompts]
    all_groups = ATTENTION + EXPERTS
    rel = {}

    def noise(w: torch.Tensor) -> torch.Tensor:
        z = torch.randn(w.shape, generator=torch.Generator().manual_seed(w.numel() % 1_000_003))
        return w * (1 + rel["fp8"] * z)

    changes = {
        "fp8": (all_groups, lambda w: fp8_round_trip(w, (128, 128))),
        "fp8 experts": (EXPERTS, lambda w: fp8_round_trip(w, (128, 128))),
        "fp8 attention": (ATTENTION, lambda w: fp8_round_trip(w, (128, 128))),
        "fp8 q k": (("q_proj", "k_proj"), lambda w: fp8_round_trip(w, (128, 128))),
        "fp8 v o": (("v_proj", "o_proj"), lambda w: fp8_round_trip(w, (128, 128))),
        "fp8 1x128": (all_groups, lambda w: fp8_round_trip(w, (1, 128))),
        "noise": (all_groups, noise),
        "bf16": (all_groups, lambda w: w.to(torch.bfloat16).float()),
    }
    rows = []
    for name in args.variants.split(","):
        groups, change = changes[name]
        model, rel[name] = variant(base, groups, change)
        cos, agree, routed = [], [], []
        for ids, (ref_logits, ref_ids, ref_routes) in zip(prompts, refs, strict=True):
            got, _, routes = logits_run(model, ids, args.steps, ref_ids)
            cos.append(F.cosine_similarity(got, ref_logits, dim=-1))
            agree.append((got.argmax(-1) == ref_logits.argmax(-1)).float())
            routed.append(same_routes(routes, ref_routes))
        cos_all, agree_all = torch.cat(cos), torch.cat(agree)
        first = torch.stack([c[0] for c in cos]).mean().item()
        rows.append(dict(
            variant=name, weight_rel_error=round(rel[name], 5), cosine_mean=round(cos_all.mean().item(), 5),
            cosine_min=round(cos_all.min().item(), 5), cosine_first_step=round(first, 5),
            argmax_agree=round(agree_all.mean().item(), 3), same_routes=round(sum(routed) / len(routed), 4),
        ))  # fmt: skip
        print(rows[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
        del model
    args.out.mkdir(parents=True, exist_ok=True)
    config = {
        k: getattr(args, k)
        for k in ("layers", "hidden", "heads", "experts", "inter", "vocab", "steps", "prompts", "seed")
    }
    (args.out / "fp8_accuracy.json").write_text(json.dumps(dict(config=config, rows=rows), indent=1))
    keys = list(rows[0])
    lines = [f"config: {config}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    (args.out / "fp8_accuracy.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
