"""PEFT adapters of both families' tiny thinkers, written by PEFT's own ``save_pretrained``, read by
``load_adapter``: the weights equal PEFT's with its scaling folded into B (rsLoRA, rank/alpha patterns,
ranks 8 and 64), every key layout loads, and each adapter omniwalk cannot serve is refused naming the key."""

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import hf_oracle, qwen2_5_omni
from safetensors.torch import load_file, save_file

from omniwalk.lora.adapters import AdapterError, load_adapter, thinker_targets
from omniwalk.models.qwen2_5_omni.checkpoint.config import Qwen25OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FAMILIES = {  # family -> (HF model, omniwalk's thinker decoder config, modules PEFT may target)
    "qwen3": (
        lambda: hf_oracle.hf_model("tiny"),
        lambda: Qwen3OmniConfig.from_hf(hf_oracle.config_dict("tiny")),
        ATTENTION,
    ),
    "qwen2_5": (
        lambda: qwen2_5_omni.hf_model("tiny"),
        lambda: Qwen25OmniConfig.from_hf(qwen2_5_omni.config_dict("tiny")),
        [*ATTENTION, "gate_proj", "up_proj", "down_proj"],
    ),
}
CONFIGS = {  # LoraConfig fields of the adapters written
    "r8": dict(r=8, lora_alpha=16),
    "r64_rslora": dict(r=64, lora_alpha=32, use_rslora=True),
    "patterns": dict(
        r=8, lora_alpha=8, rank_pattern={"q_proj": 16, "layers.1.self_attn.v_proj": 4}, alpha_pattern={"o_proj": 3}
    ),
}
SITE = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)$")


def write_adapter(base, out: Path, modules: list[str], seed: int = 0, keep=r"language_model\.layers", **fields):
    """A PEFT model of a copy of ``base`` with random non-zero LoRA weights on ``modules`` of the layers
    whose names match ``keep``, saved to ``out``.

    NOTE: PEFT resolves a regex ``target_modules`` of Qwen3-Omni (an MoE model it converts from
    transformers 4) to bare module names, which match the encoders and talker too: the layers are
    chosen by ``exclude_modules`` instead."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(target_modules=modules, exclude_modules=rf"(?!.*({keep})).*", init_lora_weights=False, **fields)
    model = get_peft_model(copy.deepcopy(base), config)
    model.save_pretrained(out)
    return model


def peft_modules(model) -> dict[tuple[int, str], torch.nn.Module]:
    sites = {}
    for name, module in model.named_modules():
        match = SITE.search(name)
        if match and hasattr(module, "lora_A"):
            sites[(int(match[1]), match[2])] = module
    return sites


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    model, config, modules = FAMILIES[request.param]
    return request.param, model(), thinker_targets(config().text), modules


@pytest.fixture(scope="module")
def thinker_adapter(family, tmp_path_factory):
    """A rank-8 adapter of the thinker alone, on every projection PEFT may target there."""
    _, hf, targets, modules = family
    out = tmp_path_factory.mktemp("thinker_r8")
    write_adapter(hf.thinker, out, modules, **CONFIGS["r8"])
    return out, targets


def test_targets_are_the_hf_thinkers_projections(family):
    _, hf, targets, modules = family
    linears = {
        (int(m[1]), m[2]): module
        for name, module in hf.thinker.named_modules()
        if (m := SITE.search(name)) and "language_model" in name and m[2] in modules
    }
    assert set(targets) == set(linears)
    for key, t in targets.items():
        assert (t.in_features, t.out_features) == (linears[key].in_features, linears[key].out_features)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("whole", [False, True], ids=["thinker", "whole_model"])
def test_weights_equal_peft_with_the_scaling_folded_into_b(family, config, whole, tmp_path):
    _, hf, targets, modules = family
    peft = write_adapter(hf if whole else hf.thinker, tmp_path, modules, seed=3, **CONFIGS[config])
    prefix = "base_model.model.thinker.model." if whole else "base_model.model.model."
    assert all(
        k.startswith(prefix + "language_model.layers.") for k in load_file(tmp_path / "adapter_model.safetensors")
    )
    expected = peft_modules(peft)
    assert set(expected) == set(targets)
    for dtype in (torch.float32, torch.bfloat16):
        adapter = load_adapter("a", str(tmp_path), targets, max_rank=64, dtype=dtype)
        assert set(adapter.weights) == set(expected)
        for key, module in expected.items():
            a, b, scaling = module.lora_A["default"].weight, module.lora_B["default"].weight, module.scaling["default"]
            ours_a, ours_b = adapter.weights[key]
            assert torch.equal(ours_a, a.detach().to(dtype)) and torch.equal(ours_b, (b.detach() * scaling).to(dtype))
    ranks = {key: m.r["default"] for key, m in expected.items()}
    assert adapter.rank == max(ranks.values())
    if config == "patterns":
        assert ranks[(0, "q_proj")] == 16 and ranks[(1, "v_proj")] == 4 and ranks[(0, "v_proj")] == 8
        assert expected[(0, "o_proj")].scaling["default"] == 3 / 8
    adapter = load_adapter("a", str(tmp_path), targets, max_rank=64, dtype=torch.float32)
    x = torch.randn(5, max(t.in_features for t in targets.values()))
    with torch.no_grad():  # PEFT's forward: the base projection plus its LoRA delta
        for key, module in expected.items():
            xi = x[:, : targets[key].in_features]
            a, b = adapter.weights[key]
            torch.testing.assert_close((xi @ a.T) @ b.T, module(xi) - module.base_layer(xi), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("old", ["model.language_model.layers", "thinker.model.language_model.layers"])
def test_transformers_4_key_layouts_load_the_same_weights(thinker_adapter, old, tmp_path):
    """Checkpoints from transformers 4 name the thinker's layers ``model.layers`` / ``thinker.model.layers``."""
    src, targets = thinker_adapter
    tensors = load_file(src / "adapter_model.safetensors")
    new = old.replace("language_model.", "")
    if old.startswith("thinker"):  # the whole-model layout of the same weights, then its transformers 4 form
        tensors = {k.replace("base_model.model.", "base_model.model.thinker.", 1): v for k, v in tensors.items()}
    renamed = {k.replace(old, new): v for k, v in tensors.items()}
    assert all(new + "." in k for k in renamed)
    expected = load_adapter("a", str(src), targets, max_rank=8, dtype=torch.float32)
    ours = load_adapter("a", str(_variant(src, tmp_path, tensors=renamed)), targets, max_rank=8, dtype=torch.float32)
    assert ours.weights.keys() == expected.weights.keys()
    assert all(torch.equal(ours.weights[k][i], expected.weights[k][i]) for k in ours.weights for i in (0, 1))


def _variant(src: Path, dst: Path, tensors=None, config=None) -> Path:
    """A copy of adapter ``src`` with its tensors and/or config replaced."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    if tensors is not None:
        save_file(tensors, dst / "adapter_model.safetensors")
    if config is not None:
        (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


KEY = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_"


def _copy_as(old: str, new: str):
    """An edit adding q_proj's lora_A of layer 0 again, under another module's key."""
    return lambda t, c: t.update({(KEY + "A.weight").replace(old, new): t[KEY + "A.weight"].clone()})


EDITS = {  # case -> (edit of (tensors, config), what the error must name)
    "experts": (_copy_as("self_attn.q_proj", "mlp.experts.0.gate_proj"), "mlp.experts.0.gate_proj"),
    "router": (_copy_as("self_attn.q_proj", "mlp.gate"), "mlp.gate.lora_A"),
    "talker": (_copy_as("model.language_model", "talker.model"), "talker.model.layers.0"),
    "embeddings": (_copy_as("language_model.layers.0.self_attn.q_proj", "embed_tokens"), "embed_tokens"),
    "unknown_layer": (_copy_as("layers.0", "layers.99"), "layers.99"),
    "missing_b": (lambda t, c: t.pop(KEY + "B.weight"), KEY + "B.weight"),
    "shape": (lambda t, c: t.update({KEY + "A.weight": t[KEY + "A.weight"][:, :-1].contiguous()}), KEY + "A.weight"),
    "integer": (lambda t, c: t.update({KEY + "B.weight": t[KEY + "B.weight"].to(torch.int32)}), KEY + "B.weight"),
    "dora": (lambda t, c: c.update(use_dora=True), "use_dora"),
    "bias": (lambda t, c: c.update(bias="all"), "bias"),
    "modules_to_save": (lambda t, c: c.update(modules_to_save=["lm_head"]), "modules_to_save"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_refused_naming_the_key(thinker_adapter, case, tmp_path):
    src, targets = thinker_adapter
    tensors, config = (
        load_file(src / "adapter_model.safetensors"),
        json.loads((src / "adapter_config.json").read_text()),
    )
    edit, named = EDITS[case]
    edit(tensors, config)
    with pytest.raises(AdapterError, match=re.escape(named)):
        load_adapter("a", str(_variant(src, tmp_path, tensors, config)), targets, max_rank=8, dtype=torch.float32)


def test_rank_above_the_maximum_is_refused(thinker_adapter):
    src, targets = thinker_adapter
    with pytest.raises(AdapterError, match=r"layers\.0\.\S+_proj\.lora_A\.weight has rank 8, above the maximum rank 4"):
        load_adapter("a", str(src), targets, max_rank=4, dtype=torch.float32)


def test_peft_refusals_of_encoders_dora_and_pickles(family, tmp_path):
    _, hf, targets, modules = family
    thinker = hf.thinker
    write_adapter(thinker, tmp_path / "enc", ["q_proj"], keep=r"language_model\.layers|audio_tower", r=4)
    with pytest.raises(AdapterError, match=r"audio_tower\.layers\.0\.self_attn\.q_proj.*audio encoder"):
        load_adapter("a", str(tmp_path / "enc"), targets, max_rank=8, dtype=torch.float32)
    write_adapter(thinker, tmp_path / "dora", ["q_proj"], r=4, use_dora=True)
    with pytest.raises(AdapterError, match="use_dora=True"):
        load_adapter("a", str(tmp_path / "dora"), targets, max_rank=8, dtype=torch.float32)
    model = write_adapter(thinker, tmp_path / "bin", ["q_proj"], r=4)
    (tmp_path / "bin" / "adapter_model.safetensors").unlink()
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    with pytest.raises(AdapterError, match="only adapter_model.bin"):
        load_adapter("a", str(tmp_path / "bin"), targets, max_rank=8, dtype=torch.float32)
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        load_adapter("a", str(tmp_path / "nothing"), targets, max_rank=8, dtype=torch.float32)
