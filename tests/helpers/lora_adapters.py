"""LoRA adapters of the tiny checkpoints' thinkers written by PEFT's own ``save_pretrained`` (random non-zero
weights: ``init_lora_weights=False``), and the HF + PEFT model that runs them as the oracle.

The HF model is a fresh one per call (PEFT injects its layers in place: never the cached oracles others share).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from helpers.hf_oracle import TEST_ROOT

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
DENSE_MLP = ("gate_proj", "up_proj", "down_proj")
ENCODERS = r".*(audio_tower|visual).*"  # their q/k/v share the language model's names


@dataclass(frozen=True)
class AdapterSpec:
    r: int
    alpha: int
    modules: tuple[str, ...] = ATTENTION
    rslora: bool = False
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)

    def config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            target_modules=list(self.modules),
            exclude_modules=ENCODERS,
            use_rslora=self.rslora,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern=dict(self.alpha_pattern),
            init_lora_weights=False,
        )


def peft_model(hf_model, specs: dict[str, AdapterSpec], seed: int = 0) -> tuple[object, dict[str, Path]]:
    """``hf_model``'s thinker with one PEFT adapter per spec (named as its key), each saved by PEFT into a
    directory of its own -> (the PEFT model, name -> directory). ``set_adapter(name)`` picks the oracle's."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    (first, spec), *rest = specs.items()
    model = get_peft_model(hf_model.thinker, spec.config(), adapter_name=first)
    for name, spec in rest:
        model.add_adapter(name, spec.config())
    paths = {}
    for name in specs:
        out = Path(tempfile.mkdtemp(prefix=f"lora_{name}_", dir=TEST_ROOT))
        model.save_pretrained(out, selected_adapters=[name])
        paths[name] = next(p.parent for p in out.rglob("adapter_config.json"))  # (PEFT nests non-default names)
    return model.eval(), paths


@torch.no_grad()
def hf_greedy(model, adapter: str | None, prompt_ids: list[int], steps: int) -> list[int]:
    """HF + PEFT greedy ids of the thinker with ``adapter`` (None: the base model, adapters off)."""
    x = torch.tensor([prompt_ids])
    kwargs = {"attention_mask": torch.ones_like(x), "max_new_tokens": steps, "min_new_tokens": steps}
    if adapter is None:
        with model.disable_adapter():
            out = model.base_model.model.generate(input_ids=x, do_sample=False, **kwargs)
    else:
        model.set_adapter(adapter)
        out = model.base_model.model.generate(input_ids=x, do_sample=False, **kwargs)
    return out[0, x.shape[1] :].tolist()
