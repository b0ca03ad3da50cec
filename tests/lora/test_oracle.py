"""LoRA adapters end to end against HF + PEFT on the tiny checkpoints of both families: each adapter alone
(and the base) gives HF's greedy ids, a batch mixing the base and three adapters gives each one's ids
alone, and speech with an adapter gives HF's thinker ids and talker codes (the talker reads the adapted
thinker). Adapters of rank 8, 16 (rank and alpha patterns) and 64 (rsLoRA), written by PEFT."""

from dataclasses import dataclass

import pytest
import torch
from helpers import qwen2_5_omni, qwen3_omni
from helpers.hf_oracle import ATTENTION, DENSE_MLP, AdapterSpec, hf_greedy, peft_model

from omniwalk import Omni

STEPS = 32
SPECS = {
    "qwen3": {
        "r8": AdapterSpec(8, 16),
        "r64": AdapterSpec(64, 32, rslora=True),
        "r16": AdapterSpec(
            16, 8, ("q_proj", "v_proj", "o_proj"), rank_pattern={"o_proj": 4}, alpha_pattern={"v_proj": 24}
        ),
    },
    "qwen2_5": {
        "r8": AdapterSpec(8, 16, ATTENTION + DENSE_MLP),
        "r64": AdapterSpec(64, 32, ATTENTION + DENSE_MLP, rslora=True),
        "r16": AdapterSpec(16, 8, DENSE_MLP, rank_pattern={"down_proj": 4}),
    },
}
ADAPTERS = [None, "r8", "r16", "r64"]  # (None: the base model)


@dataclass
class Served:
    omni: Omni
    hf: object  # the HF model's thinker wrapped by PEFT with every adapter
    whole: object  # the HF model (its thinker's modules adapted in place by PEFT)
    messages: list


def hf_model(family: str):
    if family == "qwen3":
        from transformers import Qwen3OmniMoeForConditionalGeneration

        model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_omni.checkpoint("tiny")).eval()
        model.config.talker_config.audio_config = model.config.thinker_config.audio_config  # HF bug, reference §9.6
        return model
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(qwen2_5_omni.checkpoint("tiny")).eval()


@pytest.fixture(scope="module", params=["qwen3", "qwen2_5"])
def served(request) -> Served:
    family = request.param
    hf = hf_model(family)
    peft, paths = peft_model(hf, SPECS[family], seed=7)
    checkpoint = (qwen3_omni if family == "qwen3" else qwen2_5_omni).checkpoint("tiny")
    loras = tuple(f"{name}={path}" for name, path in paths.items())
    omni = Omni(model=checkpoint, max_loras=3, max_lora_rank=64, loras=loras)
    messages = qwen3_omni.MESSAGES if family == "qwen3" else qwen2_5_omni.MESSAGES
    return Served(omni, peft, hf, messages)


def greedy(served: Served, lora: str | None, **extra) -> dict:
    request = {"messages": served.messages, "max_tokens": STEPS, "min_tokens": STEPS, "temperature": 0.0}
    return {**request, **({"lora": lora} if lora else {}), **extra}


@pytest.fixture(scope="module")
def alone(served) -> dict:
    """Each adapter's (and the base's) greedy answer, run alone."""
    return {name: served.omni.generate(greedy(served, name, logprobs=True)) for name in ADAPTERS}


def test_each_adapter_alone_equals_hf_with_peft(served, alone):
    prompt = alone[None].prompt_token_ids
    for name, out in alone.items():
        assert out.token_ids == hf_greedy(served.hf, name, prompt, STEPS), name
        assert len(out.token_ids) == STEPS
    assert len({tuple(out.token_ids) for out in alone.values()}) == len(ADAPTERS)  # every adapter changes the answer


def test_a_batch_of_the_base_and_three_adapters_equals_each_alone(served, alone):
    mixed = served.omni.generate([greedy(served, name, logprobs=True) for name in ADAPTERS])
    for name, out in zip(ADAPTERS, mixed, strict=True):
        assert out.token_ids == alone[name].token_ids, name
    # A base row is untouched by the adapters beside it: bit for bit as in a batch of base rows alone (of the same
    # shape: a step's arithmetic may depend on its batch size). Through MoE layers only closely: the rows an
    # expert's GEMM takes depend on where the other rows (adapted) are routed.
    bases = served.omni.generate([greedy(served, None, logprobs=True) for _ in ADAPTERS])
    got, expected = ([p.logprob for p in out.logprobs] for out in (mixed[0], bases[0]))
    if served.omni.family.cfg.text.is_moe:
        assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=1e-5)
    else:
        assert got == expected


@torch.no_grad()
def test_speech_with_an_adapter_equals_hf_thinker_ids_and_talker_codes(served):
    qwen3 = served.omni.family.info.name == "qwen3-omni"
    request = (speech_qwen3 if qwen3 else speech_qwen2_5)(served)
    out = served.omni.generate(request)
    base = served.omni.generate({**request, "lora": None})
    served.hf.set_adapter("r8")
    prompt = served.omni.family.prompt(request)
    ids, codes = (hf_speech_qwen3 if qwen3 else hf_speech_qwen2_5)(served, prompt)
    assert out.token_ids == ids
    assert (torch.equal(out.codes, codes) if qwen3 else out.codes == codes) and len(out.codes) > 0
    assert out.token_ids != base.token_ids  # the adapter changes what is said, and so the speech


def speech_qwen3(served: Served) -> dict:
    return qwen3_omni.greedy_speech(served.messages, voice="ethan", lora="r8")


def hf_speech_qwen3(served: Served, prompt) -> tuple[list[int], torch.Tensor]:
    """HF's greedy speech with the active adapter -> (thinker ids, talker codes [frames, groups])."""
    ids, codes, _ = qwen3_omni.hf_speech(served.whole, qwen3_omni.hf_inputs(prompt, False), "ethan")
    return ids, codes


CODES = 24


def speech_qwen2_5(served: Served) -> dict:
    speech = {"modalities": ["text", "audio"], "voice": "Ethan", "talker_temperature": 0.0}
    return {
        **greedy(served, "r8"),
        **speech,
        "max_tokens": 10,
        "min_tokens": 10,
        "max_audio_frames": CODES,
        "min_audio_frames": CODES,
    }


def hf_speech_qwen2_5(served: Served, prompt) -> tuple[list[int], list[int]]:
    """HF's greedy speech with the active adapter -> (thinker ids, talker codes), as
    ``tests/models/qwen2_5_omni/test_talker.py`` runs it: one masked pad token in front (HF then keeps the
    mask its talker needs), token2wav stubbed, codes token2wav cannot speak suppressed as ours are."""
    whole, captured = served.whole, []
    family = served.omni.family
    talker, num_codes = family.cfg.talker, family.cfg.token2wav.dit.num_embeds + 1
    unspeakable = [
        [i] for i in range(num_codes, talker.text.vocab_size) if i not in (talker.codec_pad, talker.codec_eos)
    ]
    inputs = qwen2_5_omni.hf_inputs(prompt, False)
    pad = torch.tensor([[151643]])  # <|endoftext|>
    inputs["input_ids"] = torch.cat([pad, inputs["input_ids"]], 1)
    inputs["attention_mask"] = torch.cat([torch.zeros_like(pad), inputs["attention_mask"]], 1)
    generate = whole.talker.generate

    def spy(*args, **kwargs):
        captured.append(generate(*args, **kwargs))
        return captured[-1]

    whole.talker.generate, whole.token2wav.forward = spy, lambda *a, **k: torch.zeros(4)
    try:
        ids, _ = whole.generate(
            **inputs,
            speaker="Ethan",
            thinker_max_new_tokens=10,
            thinker_min_new_tokens=10,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=CODES,
            talker_min_new_tokens=CODES,
            talker_bad_words_ids=unspeakable,
        )
    finally:
        del whole.talker.generate, whole.token2wav.forward
    start = inputs["input_ids"].shape[1]
    return ids[0, start:].tolist(), captured[0][0, start + 2 :].tolist()
