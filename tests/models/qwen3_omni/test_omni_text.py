"""``Omni`` end to end on make-tiny checkpoints: HF parity for text chat, and request semantics."""

import pytest
import torch
from helpers.qwen3_omni import MESSAGES, checkpoint, greedy, omni

from omniwalk import Omni
from omniwalk.errors import ConfigError, InvalidRequestError
from omniwalk.models.qwen3_omni.family import DEFAULT_SYSTEM_PROMPT


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
