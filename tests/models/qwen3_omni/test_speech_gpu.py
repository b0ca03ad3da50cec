"""Full-size talker step and Code2Wav in bf16 on CUDA vs HF bf16 (real 30B-A3B config, random weights).

Talker step = prefill on random inputs -> group-0 logits -> every code-predictor step (teacher
forced with HF's greedy codes) -> next-input embedding sum -> one decode step. Code2Wav = one-shot
decode of random codes, and our stream of the same codes.

Random weights are scaled like a trained model's (NOTE, measured on an H200 2026-11-29): with
every matrix N(0, 1/fan_in) the 20-layer talker's residual stream triples in norm and two bf16
implementations drift to cosine 0.9992 (all prefill positions) / 0.997 (one position) although
both are equally close to fp32 (ours 0.99896, HF 0.99874) and fp32 agrees to 1.0. Residual-branch
outputs scaled by 1/sqrt(2·layers) (GPT-2 init) keep the stream input-dominated.
"""

import pytest
import torch
from helpers.gpu_pairs import cosine, randomize_, real_config_dict, report
from helpers.qwen3_omni import make_audio_like_
from helpers.single_request import ContiguousKVCache, VocoderStream

from omniwalk.layers.decoder import use_kernels
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig
from omniwalk.models.qwen3_omni.networks.talker import Talker

BF16 = torch.bfloat16
NUM_PROMPT = 40


class ForcedSampler:
    """Returns given codes in order and records the logits it was shown."""

    def __init__(self, codes: list[int]):
        self.codes, self.logits = list(codes), []

    def __call__(self, logits: torch.Tensor, _: int) -> torch.Tensor:
        """logits [1, vocab], draw index -> the next given code as ids [1] on the device (the sampler contract)."""
        self.logits.append(logits[0].float())
        return torch.tensor([self.codes[len(self.logits) - 1]], device=logits.device)


def _talker_pair(kernels: str):
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

    data = real_config_dict()
    hf_cfg = Qwen3OmniMoeConfig(**data).talker_config
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        hf = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(hf_cfg, dtype=BF16).eval()
        ours = Talker(Qwen3OmniConfig.from_hf(data).talker, "fused" if kernels == "fused" else "reference")
        ours = ours.to(BF16).eval()
    randomize_(hf, seed=0)
    with torch.no_grad():
        for model in (hf.model, hf.code_predictor.model):
            branch_scale = (2 * len(model.layers)) ** -0.5
            for name, p in model.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                    p.mul_(branch_scale)
        for layer in hf.model.layers:  # wider router margins: bf16 rounding must not flip the 6th/7th expert
            layer.mlp.gate.weight.mul_(4)
    ours.load_state_dict(hf.state_dict())
    use_kernels(ours, kernels)
    return hf, ours


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["reference", "fused"])
@torch.no_grad()
def test_full_size_talker_step_bf16_matches_hf(kernels):
    hf, ours = _talker_pair(kernels)
    cfg = ours.cfg
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(NUM_PROMPT, cfg.text.hidden_size, generator=g, device="cuda").to(BF16)
    hf_out = hf.model(inputs_embeds=x[None], use_cache=True)
    hf_hs = hf_out.last_hidden_state[0]
    cache = ContiguousKVCache.for_config(cfg.text, BF16, "cuda")
    hs = ours.model(x, torch.arange(NUM_PROMPT, device="cuda"), cache)
    assert report("speech 1", cosine(hs, hf_hs)) >= 0.999
    assert report("speech 2", cosine(hs[-1], hf_hs[-1])) >= 0.999
    assert report("speech 3", cosine(ours.codec_head(hs), hf.codec_head(hf_hs))) >= 0.999
    hf_h, hf_logits = hf_hs[-1], ours.group0_logits(hf_hs[-1])

    code0 = int(hf_logits.argmax())
    e0 = hf.get_input_embeddings()(torch.tensor([[code0]], device="cuda"))
    hf_cp = hf.code_predictor.generate(
        inputs_embeds=torch.cat([hf_h[None, None], e0], dim=1),
        max_new_tokens=cfg.num_code_groups - 1,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    hf_codes = hf_cp.sequences[0].tolist()
    forced = ForcedSampler(hf_codes)
    rest, rest_sum = ours.code_predictor(hf_h[None], e0[0, :1], forced)
    rest, rest_sum = rest[0], rest_sum[0]
    assert rest.tolist() == hf_codes
    for step, (a, b) in enumerate(zip(forced.logits, hf_cp.logits, strict=True)):
        assert report("speech 4", cosine(a, b[0])) >= 0.999, f"code predictor step {step}"
    embeddings = hf.code_predictor.model.codec_embedding
    hf_sum = sum(emb(torch.tensor(c, device="cuda")) for emb, c in zip(embeddings, hf_codes, strict=True))
    assert report("speech 5", cosine(rest_sum, hf_sum)) >= 0.999

    text = torch.randn(cfg.text.hidden_size, generator=g, device="cuda").to(BF16)
    x_next = e0[0, 0] + hf_sum + text
    hf_next = hf.model(inputs_embeds=x_next[None, None], cache=hf_out.cache, use_cache=True).last_hidden_state[0, -1]
    h_next = ours.model(x_next[None], torch.tensor([NUM_PROMPT], device="cuda"), cache)[-1]
    assert (
        report(
            "speech 6",
            cosine(ours.group0_logits(h_next)[~ours.suppressed], ours.group0_logits(hf_next)[~ours.suppressed]),
        )
        >= 0.999
    )


def _code2wav_pair(kernels: str):
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    data = real_config_dict()
    hf_cfg = Qwen3OmniMoeConfig(**data).code2wav_config
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        hf = Qwen3OmniMoeCode2Wav._from_config(hf_cfg, dtype=BF16).eval()
        ours = Code2Wav(Qwen3OmniConfig.from_hf(data).code2wav).to(BF16).eval()
    randomize_(hf, seed=2)
    codes = torch.randint(0, 2048, (1, hf_cfg.num_quantizers, 40), generator=torch.Generator().manual_seed(0))
    make_audio_like_(hf, codes.cuda())
    ours.load_state_dict(hf.state_dict())
    use_kernels(ours, kernels)
    return hf, ours


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["reference", "fused"])
@torch.no_grad()
def test_full_size_code2wav_bf16_matches_hf_and_streams(kernels):
    hf, ours = _code2wav_pair(kernels)
    g = torch.Generator(device="cuda").manual_seed(3)
    codes = torch.randint(0, 2048, (1, 50, ours.cfg.num_quantizers), generator=g, device="cuda")
    expected = hf(codes.transpose(1, 2))[0, 0].float()
    got = ours(codes)[0].float()
    assert got.shape == expected.shape == (1920 * 50 - 555,)
    assert (expected.abs() < 1).float().mean() > 0.99, "the comparison must not be dominated by clipping"
    assert report("speech 7", cosine(got, expected)) >= 0.999
    stream = VocoderStream(ours, VocoderStreamConfig(chunk_frames=25, first_chunk_frames=5))
    chunks = [*stream.push(codes[0]), stream.finish()]  # the engine's cut: 5, 5, 10, 20 and the last 10 frames
    assert [len(c) for c in chunks] == [1920 * 5 - 555, 1920 * 5, 1920 * 10, 1920 * 20, 1920 * 10]
    streamed = torch.cat(chunks).float()
    assert report("speech 8", cosine(streamed.cpu(), got.cpu())) >= 0.999
