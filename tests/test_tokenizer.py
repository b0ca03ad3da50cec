"""Tokenizer: special/role token ids, HF agreement, and incremental detokenisation."""

import random

import pytest

from omniwalk.models.qwen3_omni.checkpoint.config import Qwen3OmniConfig
from omniwalk.models.qwen3_omni.checkpoint.tiny import SPECIAL_NAMES, make_tiny_checkpoint
from omniwalk.tokenizer import REPLACEMENT, Tokenizer

SAMPLES = ["hello world", "héllo 你好 🎉 naïve café", "  two  spaces\n\nnew lines\t tab", "123 + 4.5 = x?", ""]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(ckpt):
    return Tokenizer.from_dir(ckpt)


def test_special_and_role_tokens_sit_at_configured_ids(ckpt, tok):
    ids = Qwen3OmniConfig.from_hf(ckpt).tokens
    for field, name in SPECIAL_NAMES.items():
        assert tok.encode(name) == [getattr(ids, field)], name
    assert tok.encode("<|im_start|>assistant\n") == [ids.im_start, ids.assistant, 198]
    assert tok.encode("<|im_start|>system\n") == [ids.im_start, ids.system, 198]
    assert tok.encode("<|im_start|>user\n") == [ids.im_start, ids.user, 198]
    assert tok.encode("\n") == [198]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_and_hf_agreement(ckpt, tok, text):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ckpt)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert hf.decode(ids) == text


def test_words_a_random_model_samples_encode_back_to_their_ids(ckpt, tok):
    """The filler ids (every id between the trained vocabulary and the special tokens): an answer of
    random ids, sent back as text, is the same ids (as a published vocabulary's words are), in ours and
    in HF's reading of the file; text of other words encodes as before."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ckpt)
    first_special = Qwen3OmniConfig.from_hf(ckpt).tokens.im_start
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(2000, first_special - 1) for _ in range(16)]
        text = tok.decode(ids)
        assert tok.encode(text) == ids and hf(text, add_special_tokens=False)["input_ids"] == ids, text
    words = tok.decode(list(range(first_special - 50, first_special - 1))).split()  # the longest fillers
    assert len(words) == 49 and all(len(tok.encode(f" {w}")) == 1 for w in words)
    assert tok.encode("zebra zoo") == hf("zebra zoo", add_special_tokens=False)["input_ids"]


def test_chat_template_matches_hf(ckpt, tok):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(ckpt)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is this?"}, {"type": "image"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And this?"}]},
    ]
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>What is this?" in text
    assert tok.chat_template is not None


def test_incremental_detokenizer_never_breaks_characters(tok):
    rng = random.Random(0)
    for text in SAMPLES * 3:
        ids = tok.encode(text)
        detok = tok.detokenizer()
        pieces = []
        i = 0
        while i < len(ids):
            step = rng.randint(1, 3)
            delta = detok.add(ids[i : i + step])
            assert REPLACEMENT not in delta
            pieces.append(delta)
            i += step
        pieces.append(detok.flush())
        assert "".join(pieces) == text == detok.text


def test_detokenizer_skips_special_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\nhi there<|im_end|>")
    detok = tok.detokenizer()
    out = "".join(detok.add([i]) for i in ids) + detok.flush()
    assert out == "assistant\nhi there"
