"""Qwen2.5-Omni's talker through the engine vs HF's ``Qwen2_5OmniForConditionalGeneration.generate``
(the oracle; token2wav stubbed out, the talker's output captured): greedy thinker and talker, codec
ids identical, on two tiny configs and text / audio / image / video prompts.

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
from test_qwen2_5_omni_thinker import REQUESTS, hf, hf_inputs, omni

from omniwalk.engine.request import EngineRequest

THINKER_STEPS, CODES = 10, 24
PAD = 151643  # <|endoftext|>
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def speech_request(case: str, voice: str = "Ethan") -> dict:
    return {
        **REQUESTS[case],
        "max_tokens": THINKER_STEPS, "min_tokens": THINKER_STEPS, "temperature": 0.0,
        "modalities": ["text", "audio"], "voice": voice, "talker_temperature": 0.0,
        "max_audio_frames": CODES, "min_audio_frames": CODES,
    }  # fmt: skip


def run_alone(o, request: dict, request_id: str = "speech"):
    """One speech request through the engine (the talker walk; audio out is not served yet)."""
    walk, state = o.family.new_request(request)
    req = EngineRequest(request_id, walk, state)
    o.engine.add(req)
    while not req.status.is_done:
        o.engine.step()
    return o.family.output(req)


def hf_codes(name: str, prompt, aiv: bool) -> tuple[list[int], list[int]]:
    """HF's thinker ids and talker codes (up to its first stop code) for the same prompt."""
    model, captured = hf(name), []
    inputs = hf_inputs(prompt, aiv)
    pad = torch.tensor([[PAD]])  # one masked token in front: HF keeps the mask (see the NOTE above)
    inputs["input_ids"] = torch.cat([pad, inputs["input_ids"]], 1)
    inputs["attention_mask"] = torch.cat([torch.zeros_like(pad), inputs["attention_mask"]], 1)
    for key in ("pixel_values", "pixel_values_videos"):
        if key in inputs:
            inputs["thinker_" + key] = inputs.pop(key)
    generate = model.talker.generate

    def spy(*args, **kwargs):
        captured.append(generate(*args, **kwargs))
        return captured[-1]

    model.talker.generate, model.token2wav.forward = spy, lambda *a, **k: torch.zeros(4)
    try:
        ids, _ = model.generate(
            **inputs, speaker="Ethan", thinker_max_new_tokens=THINKER_STEPS, thinker_min_new_tokens=THINKER_STEPS,
            thinker_do_sample=False, talker_do_sample=False, talker_max_new_tokens=CODES, talker_min_new_tokens=CODES,
        )  # fmt: skip
    finally:
        del model.talker.generate, model.token2wav.forward
    start = inputs["input_ids"].shape[1]
    return ids[0, start:].tolist(), captured[0][0, start + 2 :].tolist()


@pytest.mark.parametrize("case", ["text", "audio", "image", "video"])
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_talker_codes_match_hf(name, case):
    request = speech_request(case)
    prompt = omni(name).family.prompt(request)
    out = run_alone(omni(name), request)
    thinker_ids, codes = hf_codes(name, prompt, bool(request.get("use_audio_in_video")))
    assert out.token_ids == thinker_ids
    assert len(out.codes) == CODES and out.codes == codes


def test_voices_are_case_insensitive_and_unknown_ones_are_named():
    from omniwalk.errors import InvalidRequestError

    family = omni().family
    assert family.info.voices == ("chelsie", "ethan")  # spk_dict.pt's speakers, lower case
    assert family.new_request(speech_request("text", "ETHAN"))[1].talker.sampler.params.max_tokens == CODES
    with pytest.raises(InvalidRequestError, match="unknown voice 'nobody'.*chelsie"):
        family.new_request(speech_request("text", "nobody"))
