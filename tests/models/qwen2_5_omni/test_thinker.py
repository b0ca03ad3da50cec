"""Qwen2.5-Omni through ``Omni`` vs HF transformers' ``Qwen2_5OmniForConditionalGeneration`` thinker
(the oracle), on two tiny configs: greedy ids identical over 32+ steps for text, audio, image,
video and audio-in-video prompts, logprobs within 1e-4 (fp32 on the CPU)."""

import numpy as np
import pytest
import torch
from helpers.qwen2_5_omni import MESSAGES, REQUESTS, checkpoint, hf, hf_inputs, omni

from omniwalk.models.qwen2_5_omni.processing.chat import DEFAULT_SYSTEM_PROMPT

STEPS = 32


@pytest.mark.parametrize("case", list(REQUESTS))
@pytest.mark.parametrize("name", ["tiny", "uneven"])
@torch.no_grad()
def test_greedy_thinker_matches_hf(name, case):
    request = {**REQUESTS[case], "max_tokens": STEPS, "min_tokens": STEPS, "temperature": 0.0, "logprobs": True}
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni(name).family.prompt(request)
    out = omni(name).generate(request)
    gen = hf(name).thinker.generate(
        **hf_inputs(prompt, aiv),
        max_new_tokens=STEPS,
        min_new_tokens=STEPS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.prompt_token_ids == prompt.token_ids
    assert out.token_ids == gen.sequences[0, len(prompt.token_ids) :].tolist()
    hf_logprobs = [
        torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(gen.logits, out.token_ids, strict=True)
    ]
    ours = [p.logprob for p in out.logprobs]
    assert max(abs(a - b) for a, b in zip(ours, hf_logprobs, strict=True)) < 1e-4


def test_text_prompt_is_hf_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint("tiny"))
    full = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, *MESSAGES]
    ids = tok.apply_chat_template(full, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert omni().family.prompt({"messages": MESSAGES}).token_ids == list(ids)


@pytest.mark.parametrize("case", ["image", "video", "image_audio_image", "audio_in_video"])
def test_tmrope_positions_equal_hf_get_rope_index(case):
    request = REQUESTS[case]
    aiv = bool(request.get("use_audio_in_video"))
    prompt = omni("uneven").family.prompt(request)
    inputs = hf_inputs(prompt, aiv)
    audio_lengths = inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None
    positions, delta = hf("uneven").thinker.model.get_rope_index(
        inputs["input_ids"],
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        inputs["attention_mask"],
        aiv,
        audio_lengths,
        inputs.get("video_second_per_grid"),
    )
    assert torch.equal(prompt.rope.positions, positions[:, 0].float())
    assert prompt.rope.delta == float(delta)


def test_audio_longer_than_the_processors_300_s_is_cut_as_hf_cuts_it():
    from transformers import WhisperFeatureExtractor

    from omniwalk.models.common.processing.chat import MediaPart
    from omniwalk.models.qwen2_5_omni.processing.media_inputs import measure

    long = np.zeros(301 * 16000 + 5, dtype=np.float32)
    item = measure(MediaPart("audio", {"type": "audio", "audio": long}))
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=300, n_samples=4_800_000, nb_max_frames=30000)
    frames = extractor([long], sampling_rate=16000, padding="max_length", return_attention_mask=True)["attention_mask"]
    assert len(item.data["audio"]) == 300 * 16000 and item.num_audio_tokens == ((frames.sum() - 1) // 2 - 1) // 2 + 1
