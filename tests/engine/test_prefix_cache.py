"""Prefix pages through the engine (Qwen2.5-Omni tiny, CPU): a text-out request takes the thinker KV
pages an earlier request computed for the same prompt prefix (the system prompt, up to the first
media item) and computes only the rest; its outputs equal a server without the cache
(``prefix_cache=False``). A speech request (its talker reads the thinker's prompt rows) takes none.
The pages are keyed, shared and evicted as ``test_kv_pages.py`` tests on the pool itself."""

import pytest
import torch
from helpers.qwen2_5_omni import assert_free, checkpoint, make_request

from omniwalk import Omni

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@torch.no_grad()
def test_text_requests_take_the_system_prompt_pages_and_equal_no_cache():
    on, off = Omni(model=checkpoint("tiny")), Omni(model=checkpoint("tiny"), prefix_cache=False)
    page = on.config.engine.page_size
    taken = []
    for i in (0, 1, 2, 3, 4):  # t2t, s2t, i2t, v2t with speech out, si2t
        request = make_request(i) | {"logprobs": True}
        a, b = on.generate(request), off.generate(request)
        assert a.error is None and b.error is None
        assert a.token_ids == b.token_ids, i
        diff = max(abs(p.logprob - q.logprob) for p, q in zip(a.logprobs, b.logprobs, strict=True))
        assert diff <= 1e-5, (i, diff)
        if a.codes is not None:
            assert a.codes == b.codes and torch.equal(torch.as_tensor(a.audio), torch.as_tensor(b.audio))
        taken.append(on.engine.stats()["thinker"]["prefix_tokens"])
        assert a.num_cached_tokens == taken[-1] - (taken[-2] if i else 0) and b.num_cached_tokens == 0  # (its own)
    print(f"prefix tokens taken after each request: {taken}")
    assert taken[0] == 0 and taken[1] > 0 and taken[1] % page == 0  # the first computes, the second takes
    assert taken[2] > taken[1] and taken[3] == taken[2] and taken[4] > taken[3]  # the speech request (3): none
    assert off.engine.stats()["thinker"]["prefix_tokens"] == 0 and off.engine.stats()["thinker"]["kv_pages_keyed"] == 0
    assert_free(on)
