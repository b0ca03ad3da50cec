"""Random LoRA adapters of a checkpoint's thinker, in PEFT's format, for benchmarks of adapter serving.

    python benchmarks/engine/random_adapters.py MODEL_DIR OUT_DIR [--count 4] [--rank 16] [--modules q,k,v,o]

Writes ``OUT_DIR/a0 .. a{count-1}``, each ``adapter_config.json`` + ``adapter_model.safetensors`` with
keys ``base_model.model.model.language_model.layers.N.self_attn.X_proj.lora_{A,B}.weight`` for every
layer, and prints one ``NAME=PATH`` per adapter (``--lora`` / ``Omni(loras=...)``). MODEL_DIR may be a
weightless skeleton: only its ``config.json`` is read. The weights are random and non-zero (B too,
unlike PEFT's initialisation), so the adapters change every step's output as trained ones do; their
values do not matter to a timing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def text_config(model_dir: Path) -> dict:
    """The thinker's language-model config (``thinker_config.text_config`` in both families' configs)."""
    return json.loads((Path(model_dir) / "config.json").read_text())["thinker_config"]["text_config"]


def write_random_adapters(
    model_dir: Path, out_dir: Path, count: int = 4, rank: int = 16, modules: tuple[str, ...] = ("q", "k", "v", "o")
) -> list[str]:
    """Write ``count`` adapters of ``rank`` on ``modules`` (of q, k, v, o) -> their ``NAME=PATH`` specs."""
    cfg = text_config(model_dir)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, cfg.get("num_key_value_heads", heads) * head_dim
    shapes = {"q": (hidden, q_out), "k": (hidden, kv_out), "v": (hidden, kv_out), "o": (q_out, hidden)}
    unknown = set(modules) - set(shapes)
    if unknown:
        raise SystemExit(f"unknown modules {sorted(unknown)}; known: {', '.join(shapes)}")
    specs = []
    for a in range(count):
        gen = torch.Generator().manual_seed(a)
        tensors = {}
        for layer in range(cfg["num_hidden_layers"]):
            for m in modules:
                in_f, out_f = shapes[m]
                key = f"base_model.model.model.language_model.layers.{layer}.self_attn.{m}_proj"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) / in_f**0.5
                tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * 0.01
        path = Path(out_dir) / f"a{a}"
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        config = {
            "peft_type": "LORA",
            "r": rank,
            "lora_alpha": rank,
            "target_modules": [f"{m}_proj" for m in modules],
            "bias": "none",
            "use_rslora": False,
        }
        (path / "adapter_config.json").write_text(json.dumps(config, indent=1))
        specs.append(f"a{a}={path}")
    return specs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", type=Path, help="checkpoint or skeleton directory (its config.json)")
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--modules", default="q,k,v,o", help="comma list of q,k,v,o")
    args = p.parse_args()
    modules = tuple(m for m in args.modules.split(",") if m)
    print("\n".join(write_random_adapters(args.model, args.out, args.count, args.rank, modules)))


if __name__ == "__main__":
    main()
