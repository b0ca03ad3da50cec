"""Model config normalisation: real values, both rope spellings, and field-naming errors.

`omniwalk serve`'s command line: flags from the config dataclasses, checked before anything loads."""

import copy
import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from omniwalk.cli import build_parser, format_size, parse_size
from omniwalk.errors import ConfigError
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.loader import checkpoint_layout, num_parameters
from omniwalk.models.qwen3_omni.checkpoint.tiny import PRESETS

REAL = PRESETS["qwen3-omni-30b-a3b"]
PACKAGED_TINY = Path(__file__).parents[1] / "omniwalk" / "models" / "qwen3_omni" / "checkpoint" / "tiny_config.json"


def real_dict() -> dict:
    return json.loads(REAL.read_text())


def published_form(d: dict) -> dict:
    """The raw checkpoint spelling: ``rope_scaling`` + top-level ``rope_theta``."""
    d = copy.deepcopy(d)
    for section in (
        d["thinker_config"]["text_config"],
        d["talker_config"]["text_config"],
        d["talker_config"]["code_predictor_config"],
        d["code2wav_config"],
    ):
        params = section.pop("rope_parameters")
        section["rope_theta"] = params.pop("rope_theta")
        section["rope_scaling"] = {**params, "type": params.pop("rope_type")}
    return d


@pytest.mark.parametrize("form", ["rope_parameters", "rope_scaling"])
def test_real_config_values(form):
    d = real_dict() if form == "rope_parameters" else published_form(real_dict())
    cfg = Qwen3OmniConfig.from_hf(d)
    assert cfg.text.head_dim == 128 and cfg.text.hidden_size == 2048
    assert (cfg.text.num_experts, cfg.text.num_experts_per_tok) == (128, 8)
    assert cfg.text.shared_expert_intermediate_size == 0
    assert cfg.text.rope.mrope_section == (24, 20, 20) and cfg.text.rope.theta == 1e6
    assert cfg.talker.accept_hidden_layer == 24 and cfg.talker.num_code_groups == 16
    assert (cfg.talker.text.num_experts, cfg.talker.text.num_experts_per_tok) == (128, 6)
    assert cfg.talker.text.shared_expert_intermediate_size == 768 and cfg.talker.text.norm_topk_prob
    assert cfg.talker.code_predictor.num_experts == 0 and cfg.talker.code_predictor.rope.mrope_section is None
    assert cfg.position_id_per_seconds == 13
    assert cfg.tokens.vision_start == 151652 and cfg.tokens.audio_end == 151670
    assert cfg.talker.speaker_ids == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert cfg.code2wav.samples_per_frame == 1920 and cfg.code2wav.rope_theta == 10000
    assert cfg.vision.head_dim == 72 and cfg.vision.deepstack_visual_indexes == (8, 16, 24)


def test_both_rope_forms_agree():
    assert Qwen3OmniConfig.from_hf(real_dict()) == Qwen3OmniConfig.from_hf(published_form(real_dict()))


def test_real_parameter_count():
    cfg = Qwen3OmniConfig.from_hf(REAL)
    assert num_parameters(cfg) == 35_259_818_545
    assert len(checkpoint_layout(cfg)) == 28_010  # tensors in the published checkpoint


def _mutate(path: str, value):
    d = real_dict()
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return d


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("thinker_config.text_config.rope_parameters.mrope_section", [24, 20, 16], "mrope_section"),
        ("thinker_config.text_config.hidden_size", KeyError, "thinker_config.text_config.hidden_size"),
        ("thinker_config.text_config.num_key_value_heads", 5, "num_key_value_heads"),
        ("thinker_config.text_config.num_experts_per_tok", "8", "num_experts_per_tok"),
        ("thinker_config.vision_start_token_id", KeyError, "thinker_config.vision_start_token_id"),
        ("talker_config.text_config.shared_expert_intermediate_size", KeyError, "shared_expert_intermediate_size"),
        ("talker_config.accept_hidden_layer", 49, "accept_hidden_layer"),
        ("talker_config.thinker_hidden_size", 1024, "talker_config.thinker_hidden_size"),
        ("thinker_config.audio_config.output_dim", 1024, "audio_config.output_dim"),
        ("thinker_config.vision_config.deepstack_visual_indexes", [8, 27], "deepstack_visual_indexes"),
        ("code2wav_config.num_quantizers", 8, "num_quantizers"),
        ("talker_config.speaker_id", {"ethan": 5000}, "speaker_id.ethan"),
        ("talker_config.codec_eos_token_id", -1, "codec_eos_token_id"),
        ("im_end_token_id", 200000, "im_end"),
        ("thinker_config.text_config.rope_parameters.rope_type", "yarn", "rope_type"),
    ],
)
def test_bad_config_names_the_field(path, value, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        Qwen3OmniConfig.from_hf(_mutate(path, value))


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        Qwen3OmniConfig.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Qwen3OmniConfig.from_hf(tmp_path)


def resolved(**options):
    from omniwalk.config import OmniConfig

    return OmniConfig.from_kwargs(model="m", **options)


def test_backends_resolve_by_device_and_reject_unknown_names():
    from omniwalk.config import EngineConfig, ModelConfig
    from omniwalk.errors import ConfigError

    names = ("moe_backend", "attention_backend", "decode_attention", "decoder_kernels")
    cpu = resolved()
    assert [getattr(cpu.model, n) for n in names] == ["reference"] * 4
    assert cpu.engine.cuda_graph_max_batch == 0  # graphs exist only on CUDA
    gpu = resolved(device="cuda", dtype="bfloat16")
    triton = importlib.util.find_spec("triton") is not None  # Triton kernels need Triton
    fast = ["fused" if triton else "reference", "torch_varlen", "triton" if triton else "reference"]
    fast += ["fused" if triton else "reference"]
    assert [getattr(gpu.model, n) for n in names] == fast
    assert gpu.engine.cuda_graph_max_batch == 64
    assert resolved(device="cuda").model.attention_backend == "reference"  # fp32: no flash
    assert resolved(device="cuda", moe_backend="reference").model.moe_backend == "reference"
    with pytest.raises(ConfigError, match="decode_attention"):
        ModelConfig(model="m", decode_attention="flash")
    with pytest.raises(ConfigError, match="cuda_graph_max_batch"):
        EngineConfig(cuda_graph_max_batch=-1)


def test_graph_batch_buckets():
    from omniwalk.engine.cuda_graphs import batch_buckets

    assert batch_buckets(0) == []
    assert batch_buckets(1) == [1]
    assert batch_buckets(6) == [1, 2, 4, 6]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_encoder_graph_tokens_validated_and_resolved():
    from omniwalk.config import EngineConfig
    from omniwalk.errors import ConfigError

    for bad in (-1, 100, 1000, 3 * 1024):
        with pytest.raises(ConfigError, match="encoder_graph_max_tokens"):
            EngineConfig(encoder_graph_max_tokens=bad)
    gpu = {"device": "cuda", "dtype": "bfloat16"}
    tokens = lambda **options: resolved(**options).engine.encoder_graph_max_tokens  # noqa: E731
    assert tokens(**gpu) == 8192
    assert tokens(**gpu, encoder_graph_max_tokens=256) == 256
    assert tokens(**gpu, encoder_graph_max_tokens=0) == 0
    assert tokens(**gpu, cuda_graph_max_batch=0) == 0  # the global switch
    assert tokens() == 0  # CPU: eager
    # the reference attention reads segment bounds on the host: not capturable
    assert tokens(device="cuda") == 0
    assert tokens(**gpu, attention_backend="reference") == 0


def test_help_does_not_import_torch():
    code = "import sys, contextlib\nfrom omniwalk.cli import main\nwith contextlib.suppress(SystemExit):\n"
    code += "    main(['serve', '--help'])\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--dtype {float32,bfloat16,float16}" in out.stdout and "--log-level {debug,info,warning,error}" in out.stdout
    help_text = " ".join(out.stdout.split())  # argparse wraps lines
    assert "ServerConfig.max_body_bytes: a size in bytes, units allowed (default: 64MiB)" in help_text


def test_booleans_are_flags_and_sizes_have_units():
    parse = lambda *flags: build_parser().parse_args(["serve", *flags])  # noqa: E731
    assert parse("--random-weights").random_weights is True
    assert parse("--random-weights", "false").random_weights is False
    assert parse().random_weights is False
    assert parse("--thinker-kv-bytes", "16GiB", "--max-body-bytes", "512KiB").thinker_kv_bytes == 16 * 2**30
    assert parse("--max-body-bytes", "512KiB").max_body_bytes == 512 * 2**10
    assert parse_size("1.5GB") == 1_500_000_000 and parse_size("4096") == 4096
    for size in (64 * 2**20, 16 * 2**30, 512 * 2**10, 3 * 2**20 + 1, 0):
        assert parse_size(format_size(size)) == size
    assert format_size(64 * 2**20) == "64MiB" and format_size(1000) == "1000"
    with pytest.raises(SystemExit):
        parse("--thinker-kv-bytes", "lots")


def test_a_missing_model_and_a_port_in_use_are_reported_before_anything_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", "/nonexistent", "--port", str(port)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such checkpoint directory" in out.stderr  # the model is checked first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--port", str(port)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
    assert "engine process started" not in out.stdout
