"""Qwen2.5-Omni's speech through ``Omni`` vs HF's ``Qwen2_5OmniForConditionalGeneration.generate``
(the oracle; the talker's output captured): greedy thinker and talker, codec ids identical, on two
tiny configs and text / audio / image / video prompts; the offline audio (one token2wav decode of
the whole utterance) with the same seeded noise and ODE steps: waveform cosine >= 0.9999 in fp32.

HF draws token2wav's noise from the global RNG inside ``generate``: reseeding it right before
token2wav runs gives the noise our ``seed`` draws from a seeded CPU generator. Our talker never
draws codes token2wav cannot speak (ids past its codec table; random weights draw them, HF's
token2wav would fail on one): HF gets them as ``talker_bad_words_ids``, the same suppression.

NOTE: HF 5.24's ``generate`` drops an all-ones attention mask, and its talker builds TMRoPE
positions and adds the codec pad/bos embeddings only when a mask is present, so a lone request
runs differently from the same request in a padded batch. The batched behaviour is the intended
one: HF gets the prompt left-padded by one masked token, which keeps the mask. Image and video go
to HF as ``thinker_pixel_values(_videos)``: plain pixel values would also reach its talker, which
fails on them. The talker's repetition penalty (1.05) applies under
greedy and counts the prompt's codec ids (codec mask x P, pad, bos), as HF's logits processor does.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers.qwen2_5_omni import REQUESTS, hf, hf_inputs, omni

THINKER_STEPS, CODES = 10, 24
PAD = 151643  # <|endoftext|>
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def speech_request(case: str, voice: str = "Ethan") -> dict:
    return {
        **REQUESTS[case],
        "max_tokens": THINKER_STEPS,
        "min_tokens": THINKER_STEPS,
        "temperature": 0.0,
        "modalities": ["text", "audio"],
        "voice": voice,
        "talker_temperature": 0.0,
        "max_audio_frames": CODES,
        "min_audio_frames": CODES,
    }


def unspeakable(name: str) -> list[list[int]]:
    """The talker's codes token2wav cannot speak, as HF's ``bad_words_ids``."""
    family = omni(name).family
    talker, num_codes = family.cfg.talker, family.cfg.token2wav.dit.num_embeds + 1
    stops = (talker.codec_pad, talker.codec_eos)
    return [[i] for i in range(num_codes, talker.text.vocab_size) if i not in stops]


def hf_speech(name: str, prompt, aiv: bool, seed: int | None = None, steps: int = 10):
    """HF's thinker ids, talker codes (up to its first stop code) and waveform (None without a
    ``seed``: token2wav stubbed) for the same prompt."""
    model, captured = hf(name), []
    inputs = hf_inputs(prompt, aiv)
    pad = torch.tensor([[PAD]])  # one masked token in front: HF keeps the mask (see the NOTE above)
    inputs["input_ids"] = torch.cat([pad, inputs["input_ids"]], 1)
    inputs["attention_mask"] = torch.cat([torch.zeros_like(pad), inputs["attention_mask"]], 1)
    for key in ("pixel_values", "pixel_values_videos"):
        if key in inputs:
            inputs["thinker_" + key] = inputs.pop(key)
    generate, token2wav = model.talker.generate, model.token2wav.forward

    def spy(*args, **kwargs):
        captured.append(generate(*args, **kwargs))
        return captured[-1]

    def reseeded(*args, **kwargs):
        torch.manual_seed(seed)
        return token2wav(*args, **kwargs)

    model.talker.generate = spy
    model.token2wav.forward = reseeded if seed is not None else lambda *a, **k: torch.zeros(4)
    try:
        ids, wav = model.generate(
            **inputs,
            speaker="Ethan",
            thinker_max_new_tokens=THINKER_STEPS,
            thinker_min_new_tokens=THINKER_STEPS,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=CODES,
            talker_min_new_tokens=CODES,
            talker_bad_words_ids=unspeakable(name),
            token2wav_num_steps=steps,
        )
    finally:
        del model.talker.generate, model.token2wav.forward
    start = inputs["input_ids"].shape[1]
    return ids[0, start:].tolist(), captured[0][0, start + 2 :].tolist(), wav if seed is not None else None


@pytest.mark.parametrize("case", ["text", "audio", "image", "video"])
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_talker_codes_match_hf(name, case):
    request = speech_request(case)
    prompt = omni(name).family.prompt(request)
    out = omni(name).generate(request)
    thinker_ids, codes, _ = hf_speech(name, prompt, bool(request.get("use_audio_in_video")))
    assert out.token_ids == thinker_ids
    assert len(out.codes) == CODES and out.codes == codes


@pytest.mark.parametrize(
    ("name", "case", "steps"), [("tiny", "text", 4), ("uneven", "image", 3), ("tiny", "audio", 10)]
)
@torch.no_grad()
def test_offline_audio_matches_hf(name, case, steps):
    """``Omni.generate``'s audio is one token2wav decode of the whole utterance, as HF's: with the
    same seeded noise and steps, waveform cosine >= 0.9999 (measured: max |diff| < 1e-5)."""
    request = {**speech_request(case), "seed": 17, "token2wav_num_steps": steps}
    prompt = omni(name).family.prompt(request)
    out = omni(name).generate(request)
    _, codes, wav = hf_speech(name, prompt, bool(request.get("use_audio_in_video")), seed=17, steps=steps)
    assert out.codes == codes and out.finish_reason == "length"
    samples_per_code = 2 * 240  # (repeats 2, 240 samples per mel frame: 24 kHz at 100 frames per second)
    assert out.audio.dtype == torch.float32 and out.audio.shape == wav.shape == (CODES * samples_per_code,)
    assert wav.std() > 0.02 and (wav.abs() >= 1).float().mean() < 0.01  # (unclipped: differences would show)
    assert F.cosine_similarity(out.audio.double(), wav.double(), dim=0) >= 0.9999
    assert (out.audio - wav).abs().max() < 1e-4
    other = omni(name).generate({**request, "seed": 18})
    assert other.codes == out.codes  # the seed is the noise only:
    assert F.cosine_similarity(other.audio, out.audio, dim=0) < 0.999


def test_voices_are_case_insensitive_and_unknown_ones_are_named():
    from omniwalk.errors import InvalidRequestError

    family = omni().family
    assert family.info.voices == ("chelsie", "ethan")  # spk_dict.pt's speakers, lower case
    assert family.new_request(speech_request("text", "ETHAN"))[1].talker.sampler.params.max_tokens == CODES
    with pytest.raises(InvalidRequestError, match="unknown voice 'nobody'.*chelsie"):
        family.new_request(speech_request("text", "nobody"))
