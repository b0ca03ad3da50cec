"""``Omni`` end to end on make-tiny checkpoints: HF parity for text chat, and request semantics.

``Omni`` with audio / image / video inputs vs HF's thinker fed the same preprocessed media.

Decoding, mel and patch maths and the encoders are tested against HF in the media tests; this
checks the wiring: measured counts, prompt layout, encoder row order, scatter, DeepStack and
MRoPE end to end (greedy tokens identical over 24 steps).

``Omni`` speech output end to end vs HF ``generate`` (thinker + talker + code predictor + Code2Wav).

/v1/audio/speech's engine side: a forced answer is committed whole after the prompt's prefill
(no thinker decode steps) and the talker voices exactly it.

Full-size talker step and Code2Wav in bf16 on CUDA vs HF bf16 (real 30B-A3B config, random weights).

Talker step = prefill on random inputs -> group-0 logits -> every code-predictor step (teacher
forced with HF's greedy codes) -> next-input embedding sum -> one decode step. Code2Wav = one-shot
decode of random codes, and our stream of the same codes.

Random weights are scaled like a trained model's (NOTE, measured on an H200 2026-11-29): with
every matrix N(0, 1/fan_in) the 20-layer talker's residual stream triples in norm and two bf16
implementations drift to cosine 0.9992 (all prefill positions) / 0.997 (one position) although
both are equally close to fp32 (ours 0.99896, HF 0.99874) and fp32 agrees to 1.0. Residual-branch
outputs scaled by 1/sqrt(2·layers) (GPT-2 init) keep the stream input-dominated."""

import base64
import io
from functools import cache

import pytest
import torch
from helpers.gpu_pairs import cosine, randomize_, real_config_dict, report
from helpers.qwen3_omni import (
    AUDIO,
    FRAMES,
    IMAGE,
    MESSAGES,
    REQUESTS,
    checkpoint,
    greedy,
    greedy_speech,
    hf_inputs,
    hf_speech,
    make_audio_like_,
    omni,
    wav_data_url,
)
from helpers.single_request import ContiguousKVCache, VocoderStream

from omniwalk import Omni
from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.layers.decoder import use_kernels
from omniwalk.models.common.programs.thinker_program import ThinkerProgram
from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.family import DEFAULT_SYSTEM_PROMPT
from omniwalk.models.qwen3_omni.networks.code2wav import Code2Wav
from omniwalk.models.qwen3_omni.networks.code2wav_stream import VocoderStreamConfig
from omniwalk.models.qwen3_omni.networks.talker import Talker


@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_greedy_text_chat_matches_hf(name):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    out = omni(name).generate(greedy(logprobs=True))
    tok = AutoTokenizer.from_pretrained(checkpoint(name))
    full = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, *MESSAGES]
    ids = tok.apply_chat_template(full, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out.prompt_token_ids == list(ids)

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint(name)).eval()
    x = torch.tensor([out.prompt_token_ids])
    gen = hf.thinker.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=64,
        min_new_tokens=64,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.token_ids == gen.sequences[0, x.shape[1] :].tolist()
    assert out.finish_reason == "length" and len(out.token_ids) == 64
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
    expected = torch.log_softmax(torch.cat(gen.logits).float(), -1)
    got = torch.tensor([p.logprob for p in out.logprobs])
    assert torch.allclose(got, expected[torch.arange(64), gen.sequences[0, x.shape[1] :]], atol=1e-4)


def test_batch_of_requests_returns_a_list_in_order():
    outs = omni().generate([greedy(4), greedy(6)])
    assert [len(o.token_ids) for o in outs] == [4, 6]
    assert outs[1].token_ids[:4] == outs[0].token_ids


def test_eos_ends_the_request_unless_masked_or_ignored():
    o = omni()
    eos = o.family.cfg.tokens.im_end
    # make EOS the argmax at every step
    head = o.family.parts["thinker"].lm_head
    hook = head.register_forward_hook(lambda m, args, out: out.index_fill(-1, torch.tensor([eos]), 1e4))
    try:
        stopped = o.generate({"messages": MESSAGES, "max_tokens": 8, "temperature": 0.0})
        masked = o.generate({"messages": MESSAGES, "max_tokens": 8, "min_tokens": 3, "temperature": 0.0})
        ignored = o.generate({"messages": MESSAGES, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    finally:
        hook.remove()
    assert stopped.token_ids == [eos] and stopped.finish_reason == "stop"
    assert len(masked.token_ids) == 4 and masked.token_ids[-1] == eos and eos not in masked.token_ids[:3]
    assert len(ignored.token_ids) == 8 and ignored.finish_reason == "length"


def test_stop_string_cuts_text():
    full = omni().generate(greedy(24))
    stop = full.text[5:8]
    out = omni().generate({**greedy(24), "min_tokens": 0, "stop": [stop]})
    assert out.finish_reason == "stop" and out.text == full.text[: full.text.find(stop)]


def test_seeded_sampling_is_reproducible():
    req = {"messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 7}
    a, b = omni().generate(req), omni().generate(req)
    c = omni().generate({**req, "seed": 8})
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_prompt_longer_than_context_is_a_typed_error():
    short = Omni(model=checkpoint("tiny"), max_model_len=16)
    with pytest.raises(InvalidRequestError, match="context length is 16"):
        short.generate(greedy(4))
    roomy = Omni(model=checkpoint("tiny"), max_model_len=len(omni().generate(greedy(1)).prompt_token_ids) + 3)
    out = roomy.generate({"messages": MESSAGES, "max_tokens": 50, "temperature": 0.0, "ignore_eos": True})
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_request_errors_are_typed():
    with pytest.raises(InvalidRequestError, match="unknown content type 'file'"):
        omni().generate({"messages": [{"role": "user", "content": [{"type": "file"}]}]})
    with pytest.raises(InvalidRequestError, match="temperature"):
        omni().generate({"messages": MESSAGES, "temperature": -1})
    with pytest.raises(ConfigError, match="unknown option"):
        Omni(model=checkpoint("tiny"), colour="blue")


STEPS = 24


@cache
def hf(name: str):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint(name)).eval()


@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_media_chat_matches_hf(name, case):
    request = {**REQUESTS[case], "max_tokens": STEPS, "min_tokens": STEPS, "temperature": 0.0}
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni(name).family.prompt(request)
    if aiv:
        t = omni(name).family.cfg.tokens
        assert t.audio_start in prompt.token_ids and prompt.token_ids.count(t.audio_pad) > 0
    out = omni(name).generate(request)
    inputs = hf_inputs(prompt, aiv)
    gen = hf(name).thinker.generate(**inputs, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    assert out.prompt_token_ids == prompt.token_ids
    assert out.token_ids == gen[0, len(prompt.token_ids) :].tolist()


def test_base64_audio_and_data_url_image_parts():
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(IMAGE).save(png, format="PNG")
    image_url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    b64_wav = wav_data_url(AUDIO).split(",", 1)[1]
    in_memory = omni().family.prompt(REQUESTS["audio_image"])
    encoded = omni().family.prompt(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": b64_wav, "format": "wav"}},
                        {"type": "image_url", "image_url": {"url": image_url}},
                        {"type": "text", "text": "what is it"},
                    ],
                }
            ]
        }
    )
    assert encoded.token_ids == in_memory.token_ids


def test_remote_urls_and_bad_base64_are_typed_errors():
    with pytest.raises(InvalidRequestError, match="data: URL"):
        omni().family.prompt(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}],
                    }
                ]
            }
        )
    with pytest.raises(InvalidRequestError, match="base64"):
        omni().family.prompt(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "***", "format": "wav"}}],
                    }
                ]
            }
        )


def test_local_image_path_when_the_operator_allows_a_directory(tmp_path):
    from helpers.qwen3_omni import checkpoint
    from PIL import Image

    from omniwalk import Omni

    Image.fromarray(IMAGE).save(tmp_path / "cat.png")
    allowed = Omni(model=checkpoint("tiny"), local_media_dir=str(tmp_path))
    by_path = allowed.family.prompt(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "cat.png"}]}]}
    )
    in_memory = omni().family.prompt({"messages": [{"role": "user", "content": [{"type": "image", "image": IMAGE}]}]})
    assert by_path.token_ids == in_memory.token_ids
    with pytest.raises(InvalidRequestError, match="local paths are not read"):
        omni().family.prompt(
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "cat.png"}]}]}
        )


@cache
def hf_speaking(name: str):
    """HF's model with its talker set up to speak (its own cache: :func:`hf` serves the text tests)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint(name)).eval()
    model.config.talker_config.audio_config = model.config.thinker_config.audio_config  # HF bug, reference §9.6
    return model


def run_hf(name: str, inputs: dict, voice: str):
    """HF greedy speech -> (generated ids, codes [F, G], waveform)."""
    return hf_speech(hf_speaking(name), inputs, voice)


SPEECH_CASES = [
    ("text", "Chelsie"),
    ("audio_image", "Chelsie"),
    ("image", "ethan"),
    ("audio", "AIDEN"),
    ("video", "chelsie"),
    ("multi_turn", "Ethan"),
    ("image_audio_image", "aiden"),
]


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
@pytest.mark.parametrize("case, voice", SPEECH_CASES)
@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_speech_matches_hf_generate(name, case, voice):
    messages = MESSAGES if case == "text" else REQUESTS[case]["messages"]
    request = greedy_speech(messages, voice=voice)
    out = omni(name).generate(request)
    prompt = omni(name).family.prompt(request)
    ids, codes, wav = run_hf(name, hf_inputs(prompt, False), voice)
    assert out.token_ids == ids
    assert out.codes.shape == (FRAMES, omni(name).family.cfg.talker.num_code_groups)
    assert torch.equal(out.codes, codes)
    assert out.audio.shape == wav.shape == (1920 * FRAMES - 555,)
    assert (out.audio - wav).abs().max() <= 1e-4


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
def test_voices_differ_and_do_not_leak_between_requests():
    # Sampled (seeded) talker: with random tiny weights greedy codes barely depend on the voice.
    sampled = {"talker_temperature": 0.9, "code_predictor_temperature": 1.0, "seed": 3}
    requests = [greedy_speech(MESSAGES, voice=v, **sampled) for v in ("ethan", "aiden", "ethan")]
    outs = omni().generate(requests)
    alone = omni().generate(requests[1])
    assert torch.equal(outs[0].codes, outs[2].codes)
    assert not torch.equal(outs[0].codes, outs[1].codes)
    assert torch.equal(outs[1].codes, alone.codes)


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
def test_text_only_requests_return_no_audio():
    out = omni().generate({"messages": MESSAGES, "max_tokens": 3})
    assert out.audio is None and out.codes is None


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"voice": "nobody"}, "unknown voice 'nobody'.*aiden, chelsie, ethan"),
        ({"modalities": ["audio"]}, "modalities must be"),
        ({"modalities": ["text", "video"]}, "modalities must be"),
        ({"talker_temperature": -1.0}, "temperature"),
        ({"min_audio_frames": 9, "max_audio_frames": 3}, "audio_frames"),
    ],
)
def test_bad_speech_requests_are_typed_errors(fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        omni().generate({**greedy_speech(MESSAGES), **fields})


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
def test_codec_eos_stops_after_min_audio_frames():
    """A codec head that always prefers EOS: EOS is masked for min_audio_frames frames, then stops."""
    o = omni()
    talker = o.family.parts["talker"]
    eos, original = o.family.cfg.talker.codec.eos, talker.group0_logits
    talker.group0_logits = lambda h: original(h).index_fill(-1, torch.tensor([eos]), 1e4)
    try:
        three = o.generate({**greedy_speech(MESSAGES), "min_audio_frames": 3, "max_audio_frames": 10})
        none = o.generate({**greedy_speech(MESSAGES), "min_audio_frames": 0, "max_audio_frames": 10})
    finally:
        del talker.group0_logits
    groups = o.family.cfg.talker.num_code_groups
    assert three.codes.shape == (3, groups) and three.audio.shape == (1920 * 3 - 555,)
    assert none.codes.shape == (0, groups) and none.audio.numel() == 0 and none.finish_reason == "length"


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
def test_speech_sampling_is_seeded_per_request_and_never_emits_control_codes():
    def codes(seed):
        request = {**greedy_speech(MESSAGES, voice="chelsie"), "min_audio_frames": 6, "max_audio_frames": 6}
        request.update(talker_temperature=0.9, code_predictor_temperature=1.0, seed=seed)
        return omni().generate(request).codes

    first, again, other = codes(1), codes(1), codes(2)
    cfg = omni().family.cfg.talker
    assert first.shape == (6, cfg.num_code_groups)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert int(first[:, 0].max()) < cfg.text.vocab_size - 1024  # control codes are suppressed
    assert int(first[:, 1:].max()) < cfg.code_predictor.vocab_size


TEXT = "the quick brown fox jumps over the lazy dog and runs far away"  # 12 words
SPEECH = {"talker_temperature": 0.0, "code_predictor_temperature": 0.0, "min_audio_frames": 6, "max_audio_frames": 6}


def test_a_forced_answer_is_spoken_without_thinker_decode_steps(monkeypatch):
    o = omni("tiny")
    rows = []
    run = ThinkerProgram.run

    def spy(self, batch, kv):
        rows.extend((req.id, start, n, req.state.thinker.prompt.num_prompt_tokens) for req, start, n in batch)
        return run(self, batch, kv)

    monkeypatch.setattr(ThinkerProgram, "run", spy)
    request = {
        "messages": [{"role": "system", "content": "Read aloud."}, {"role": "user", "content": TEXT}],
        "modalities": ["text", "audio"],
        "forced_answer": TEXT,
        "request_id": "speech",
        **SPEECH,
    }
    out = o.generate(request)
    assert out.text == TEXT and out.finish_reason == "stop"
    assert out.token_ids == o.family.tokenizer.encode(TEXT) + [o.family.cfg.tokens.im_end]
    mine = [(start, n, num_prompt) for rid, start, n, num_prompt in rows if rid == "speech"]
    assert mine and all(start + n <= num_prompt for start, n, num_prompt in mine)  # prompt rows only
    assert out.codes.shape[0] == 6 and len(out.audio) > 0


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


def _bf16_pair(part: str, hf_class: str, make_ours, seed: int, prepare, kernels: str):
    """HF's ``part`` of the real config and ours in bf16 on CUDA -> (hf, ours): HF's weights random
    (``randomize_`` with ``seed``, then ``prepare(hf)``), ours loaded from them and set to ``kernels``."""
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe

    data = real_config_dict()
    hf_cfg = getattr(Qwen3OmniMoeConfig(**data), f"{part}_config")
    hf_cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        hf = getattr(modeling_qwen3_omni_moe, hf_class)._from_config(hf_cfg, dtype=BF16).eval()
        ours = make_ours(getattr(Qwen3OmniConfig.from_hf(data), part)).to(BF16).eval()
    randomize_(hf, seed=seed)
    prepare(hf)
    ours.load_state_dict(hf.state_dict())
    use_kernels(ours, kernels)
    return hf, ours


@torch.no_grad()
def _scale_like_trained(hf) -> None:
    """Residual-branch outputs scaled by 1/sqrt(2·layers); router margins widened."""
    for model in (hf.model, hf.code_predictor.model):
        branch_scale = (2 * len(model.layers)) ** -0.5
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.mul_(branch_scale)
    for layer in hf.model.layers:  # wider router margins: bf16 rounding must not flip the 6th/7th expert
        layer.mlp.gate.weight.mul_(4)


def _talker_pair(kernels: str):
    def talker(cfg):
        return Talker(cfg, "fused" if kernels == "fused" else "reference")

    return _bf16_pair("talker", "Qwen3OmniMoeTalkerForConditionalGeneration", talker, 0, _scale_like_trained, kernels)


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


def _audio_like(hf) -> None:
    codes = torch.randint(0, 2048, (1, hf.config.num_quantizers, 40), generator=torch.Generator().manual_seed(0))
    make_audio_like_(hf, codes.cuda())


def _code2wav_pair(kernels: str):
    return _bf16_pair("code2wav", "Qwen3OmniMoeCode2Wav", Code2Wav, 2, _audio_like, kernels)


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
