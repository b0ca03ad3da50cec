"""FP8 weights on the CPU (``layers/fp8.py``, ``checkpoint/quantization.py``): the block-wise format,
FP8 checkpoints written by ``make-tiny --quantization fp8`` and loaded, bf16 checkpoints quantised at
load, and greedy ids of the FP8 model against a model built from the dequantised weights.

The oracle for dequantisation is written here independently of the package: each stored e4m3 value
times its block's scale (``torch.kron`` of the scale grid with a block of ones), in fp32."""

import json
import re

import pytest
import torch
from helpers.hf_oracle import TINY_CONFIGS
from helpers.single_request import ContiguousKVCache
from safetensors import safe_open
from safetensors.torch import save_file

from omniwalk import Omni
from omniwalk.config import ModelConfig
from omniwalk.errors import CheckpointError, ConfigError
from omniwalk.layers import fp8
from omniwalk.layers.fp8 import FP8, Fp8Linear, concat_rows, dequantize, quantize
from omniwalk.models.common.checkpoint import weights as weights_module
from omniwalk.models.common.checkpoint.weights import SCALE, checkpoint_files
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import fp8_names, load_components
from omniwalk.models.qwen3_omni.checkpoint.quantization import NOT_CONVERTED
from omniwalk.models.qwen3_omni.checkpoint.tiny import make_tiny_checkpoint

BLOCKS = [(128, 128), (16, 32), (8, 8)]


def _dequantized(q: torch.Tensor, scale: torch.Tensor, block) -> torch.Tensor:
    """The test's own dequantisation of one 2-D weight."""
    n, k = q.shape
    return q.float() * torch.kron(scale, torch.ones(block))[:n, :k]


def _tensors(ckpt) -> dict[str, torch.Tensor]:
    out = {}
    for name, path in checkpoint_files(ckpt).items():
        with safe_open(str(path), "pt") as f:
            out[name] = f.get_tensor(name)
    return out


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fp8") / "ckpt", quantization="fp8")


@pytest.fixture(scope="module")
def dequantized_ckpt(fp8_ckpt, tmp_path_factory):
    """The FP8 checkpoint with every FP8 weight replaced by its dequantised fp32 value (no scales)."""
    out = tmp_path_factory.mktemp("deq") / "ckpt"
    out.mkdir()
    tensors = _tensors(fp8_ckpt)
    config = json.loads((fp8_ckpt / "config.json").read_text())
    block = tuple(config.pop("quantization_config")["weight_block_size"])
    plain = {n: _dequantized(t, tensors[n + SCALE], block) if t.dtype == FP8 else t for n, t in tensors.items()}
    save_file({n: t for n, t in plain.items() if not n.endswith(SCALE)}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    for f in fp8_ckpt.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", [(72, 200), (128, 256), (5, 3), (3, 40, 24)])
def test_quantize_round_trip(block, shape):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    q, scale = quantize(w, block)
    assert q.dtype == FP8 and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (
        *shape[:-2],
        -(-shape[-2] // block[0]),
        -(-shape[-1] // block[1]),
    )
    deq = dequantize(q, scale, block, torch.float32)
    for i in range(w.shape[0]) if w.dim() == 3 else [None]:
        ours, qi, si = (deq, q, scale) if i is None else (deq[i], q[i], scale[i])
        assert torch.equal(ours, _dequantized(qi, si, block))  # exactly stored value x scale, partial blocks too
    # each block's largest magnitude maps to e4m3's largest value; elements within e4m3's relative step (2^-3)
    assert q.float().abs().max() == fp8.FP8_MAX
    assert ((deq - w).abs() <= w.abs() * 2**-4 + scale.max() * 2**-9).all()


def test_zero_blocks_keep_unit_scales():
    q, scale = quantize(torch.zeros(8, 8), (4, 4))
    assert torch.equal(scale, torch.ones(2, 2)) and torch.equal(q.float(), torch.zeros(8, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_rounds_once_to_nearest_even(dtype):
    """A block whose largest magnitude is 448 has scale 1, so ``quantize`` stores each value rounded once
    from fp32 to e4m3, to nearest, ties to the even code: midpoints of normal and subnormal steps, and of
    the top binade, land on the even neighbour (the same in a bf16 weight: no other rounding step)."""
    step = 2.0**-9  # e4m3's subnormal step
    ties = [1.0625, 1.1875, -1.0625, -1.1875, 1.5 * step, 2.5 * step, -2.5 * step, 248.0, 3.25, 3.75]
    even = [1.0, 1.25, -1.0, -1.25, 2 * step, 2 * step, -2 * step, 256.0, 3.25, 3.75]
    w = torch.zeros(4, 16)
    w[0, : len(ties)] = torch.tensor(ties)
    w[3, 15] = 448.0
    q, scale_inv = quantize(w.to(dtype), (4, 16))
    assert scale_inv.tolist() == [[1.0]]
    assert q.float()[0, : len(ties)].tolist() == even and q.float()[3, 15].item() == 448.0


@pytest.mark.parametrize("rows", [(64, 32, 32), (256, 128, 128), (40, 24)])
def test_merged_rows_keep_each_parts_values(rows):
    """q/k/v (or gate/up) merged: parts whose rows are not whole blocks are regridded exactly."""
    g = torch.Generator().manual_seed(1)
    parts = [quantize(torch.randn(n, 200, generator=g), (128, 128)) for n in rows]
    q, scale, block = concat_rows(parts, (128, 128))
    assert block[1] == 128 and all(n % block[0] == 0 for n in rows[:-1])
    expected = torch.cat([_dequantized(pq, ps, (128, 128)) for pq, ps in parts])
    assert torch.equal(dequantize(q, scale, block, torch.float32), expected)


def test_fp8_linear_dequantises_in_the_input_dtype():
    linear = torch.nn.Linear(48, 24, bias=False)
    f = Fp8Linear.from_linear(linear, (16, 16))
    x = torch.randn(3, 48)
    expected = x @ _dequantized(f.weight, f.weight_scale_inv, (16, 16)).T
    torch.testing.assert_close(f(x), expected, rtol=1e-6, atol=1e-6)
    assert f(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="scale grid"):
        Fp8Linear(f.weight, f.weight_scale_inv[:1], (16, 16))


def test_fp8_checkpoint_layout(fp8_ckpt):
    """make-tiny --quantization fp8: Qwen's format, for exactly the weights we quantise."""
    config = json.loads((fp8_ckpt / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]
    assert config["activation_scheme"] == "dynamic" and config["modules_to_not_convert"] == list(NOT_CONVERTED)
    tensors = _tensors(fp8_ckpt)
    stored = {n for n, t in tensors.items() if t.dtype == FP8}
    assert stored == {n.removesuffix(SCALE) for n in tensors if n.endswith(SCALE)}
    assert stored == set(fp8_names(Qwen3OmniConfig.from_hf(fp8_ckpt)))
    names = sorted(stored)
    assert any(".mlp.experts.3.up_proj." in n for n in names) and any("shared_expert.down_proj" in n for n in names)
    assert any("code_predictor.model.layers.0.mlp.gate_proj" in n for n in names)
    kept = ("lm_head", "mlp.gate.", "shared_expert_gate", "embed", "norm", "audio_tower", "visual", "code2wav.")
    assert not [n for n in names if any(k in n for k in kept) or "projection" in n]


@torch.no_grad()
def test_fp8_checkpoint_loads_as_stored_and_dequantised(fp8_ckpt):
    """quantization fp8 keeps the stored bytes and scales; "none" holds exactly their products."""
    tensors = _tensors(fp8_ckpt)
    quantized = load_components(fp8_ckpt, ("thinker", "talker"), quantization="fp8")
    plain = load_components(fp8_ckpt, ("thinker", "talker"))
    layer = quantized["talker"].model.layers[1]
    stem = "talker.model.layers.1."
    assert layer.self_attn.q_proj.weight.dtype == FP8
    assert torch.equal(
        layer.self_attn.q_proj.weight.view(torch.uint8), tensors[stem + "self_attn.q_proj.weight"].view(torch.uint8)
    )
    assert torch.equal(layer.self_attn.q_proj.weight_scale_inv, tensors[stem + "self_attn.q_proj.weight_scale_inv"])
    experts = layer.mlp.experts
    up = tensors[stem + "mlp.experts.2.up_proj.weight"]
    inter = up.shape[0]
    assert torch.equal(experts.gate_up_proj[2, inter:].view(torch.uint8), up.view(torch.uint8))
    assert torch.equal(experts.gate_up_proj_scale_inv[2, 1], tensors[stem + "mlp.experts.2.up_proj.weight_scale_inv"])
    for name, t in tensors.items():  # every FP8 weight of the plain model = stored value x scale, exactly
        if t.dtype == FP8:
            assert torch.equal(_plain_weight(plain, name), _dequantized(t, tensors[name + SCALE], (128, 128))), name


def _plain_weight(parts: dict, name: str) -> torch.Tensor:
    """The weight a checkpoint name fills in our modules (experts: a slice of the fused tensor)."""
    component, rest = name.split(".", 1)
    m = re.match(r"(?P<stem>.*\.experts)\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$", rest)
    if not m:
        return parts[component].get_parameter(rest)
    fused = parts[component].get_submodule(m["stem"])
    half, e = fused.down_proj.shape[2], int(m["e"])
    return {
        "gate_proj": fused.gate_up_proj[e, :half],
        "up_proj": fused.gate_up_proj[e, half:],
        "down_proj": fused.down_proj[e],
    }[m["proj"]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_model_greedy_ids_equal_the_dequantised_model(fp8_ckpt, dequantized_ckpt, dtype):
    """The FP8 model against a model built from the dequantised weights (same math): ids and codes."""
    fp8_model = Omni(model=str(fp8_ckpt), quantization="fp8", dtype=dtype)
    reference = Omni(model=str(dequantized_ckpt), dtype=dtype)
    text = {"messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 32, "temperature": 0.0}
    speech = {**text, "max_tokens": 12, "modalities": ["text", "audio"], "talker_temperature": 0.0}
    speech |= {"code_predictor_temperature": 0.0, "max_audio_frames": 10, "ignore_eos": True}
    for request in ({**text, "ignore_eos": True}, speech):
        ours, ref = fp8_model.generate(request), reference.generate(request)
        assert ours.token_ids == ref.token_ids and len(ours.token_ids) == request["max_tokens"]
    assert torch.equal(ours.codes, ref.codes) and ours.codes.shape[0] == 10
    assert fp8_model.family.info.weights["quantization"] == "fp8"
    assert reference.family.info.weights["quantization"] == "none"


@torch.no_grad()
def test_bf16_checkpoint_quantised_one_tensor_at_a_time(tmp_path, monkeypatch):
    """Online: each checkpoint tensor is quantised as it is read (never the model at once), and the
    result equals quantising the stored tensor."""
    ckpt = make_tiny_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16)
    tensors = _tensors(ckpt)
    shapes = []
    original = fp8.quantize
    monkeypatch.setattr(
        weights_module.fp8, "quantize", lambda w, block: shapes.append(tuple(w.shape)) or original(w, block)
    )
    talker = load_components(ckpt, ("talker",), quantization="fp8", dtype=torch.bfloat16)["talker"]
    assert shapes and {s for s in shapes} <= {tuple(t.shape) for t in tensors.values()}
    attn = talker.code_predictor.model.layers[0].self_attn
    q, scale = original(tensors["talker.code_predictor.model.layers.0.self_attn.k_proj.weight"], (128, 128))
    assert torch.equal(attn.k_proj.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(attn.k_proj.weight_scale_inv, scale)
    assert talker.codec_head.weight.dtype == torch.bfloat16  # (heads stay in the model dtype)


def test_bad_quantization_is_refused(fp8_ckpt, tmp_path):
    with pytest.raises(ConfigError, match="quantization"):
        ModelConfig(model="x", quantization="int4")
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((fp8_ckpt / "config.json").read_text())
    for quant, match in (
        ({"quant_method": "awq"}, "not supported"),
        ({"quant_method": "fp8", "weight_block_size": [100, 128]}, "powers of two"),
    ):
        (bad / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
        with pytest.raises(CheckpointError, match=match):
            load_components(bad, ("thinker",))


def test_fp8_weight_without_its_scales_is_an_error(fp8_ckpt, tmp_path):
    tensors = _tensors(fp8_ckpt)
    out = tmp_path / "noscale"
    out.mkdir()
    missing = "thinker.model.layers.0.self_attn.o_proj.weight_scale_inv"
    save_file({n: t for n, t in tensors.items() if n != missing}, str(out / "model.safetensors"))
    (out / "config.json").write_text((fp8_ckpt / "config.json").read_text())
    for quantization in ("fp8", "none"):
        with pytest.raises(CheckpointError, match="o_proj.weight_scale_inv"):
            load_components(out, ("thinker",), quantization=quantization)


@torch.no_grad()
def test_uneven_shapes_and_a_small_block(tmp_path):
    """Odd sizes (hidden 48, experts 20 wide, head dim 12) under a 16 x 32 block: partial blocks at
    every edge. Each FP8 weight loads as stored; dequantised it equals stored x scale exactly; the
    FP8 thinker's and talker's outputs equal those of the model holding the dequantised weights."""
    config = json.loads(TINY_CONFIGS["uneven"].read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [16, 32]}
    ckpt = make_tiny_checkpoint(tmp_path / "uneven", config, quantization="fp8")
    assert json.loads((ckpt / "config.json").read_text())["quantization_config"]["weight_block_size"] == [16, 32]
    tensors = _tensors(ckpt)
    names = ("thinker", "talker")
    quantized, plain = load_components(ckpt, names, quantization="fp8"), load_components(ckpt, names)
    for name, t in tensors.items():
        if t.dtype == FP8:
            assert torch.equal(_plain_weight(plain, name), _dequantized(t, tensors[name + SCALE], (16, 32))), name
    assert quantized["thinker"].model.layers[0].mlp.experts.block == (16, 32)
    cfg = Qwen3OmniConfig.from_hf(ckpt)
    ids = torch.randint(0, 1000, (9,), generator=torch.Generator().manual_seed(3))
    logits = [
        m(ids, torch.arange(9), ContiguousKVCache.for_config(cfg.text, torch.float32, "cpu"), all_logits=True).logits
        for m in (quantized["thinker"], plain["thinker"])
    ]
    assert torch.equal(logits[0], logits[1])
    x = torch.randn(4, cfg.talker.text.hidden_size, generator=torch.Generator().manual_seed(4))
    hidden = [
        m.model(x, torch.arange(4), ContiguousKVCache.for_config(cfg.talker.text, torch.float32, "cpu"))
        for m in (quantized["talker"], plain["talker"])
    ]
    assert torch.equal(hidden[0], hidden[1])
