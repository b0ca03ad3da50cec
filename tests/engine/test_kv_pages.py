"""Page pool bookkeeping and paged attention against plain causal attention.

Prefix pages through the engine (Qwen2.5-Omni tiny, CPU): a text-out request takes the thinker KV
pages an earlier request computed for the same prompt prefix (ids, positions and media contents)
and computes only the rest; its outputs equal a server without the cache (``prefix_cache=False``).
A Qwen2.5-Omni speech request (its talker reads thinker rows that are not kept) takes none; a
Qwen3-Omni one takes its conversation's history in the thinker and the talker.
The pages are keyed, shared and evicted as ``test_kv_pages.py`` tests on the pool itself."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.qwen2_5_omni import assert_free, checkpoint, make_request

from omniwalk import Omni
from omniwalk.engine.kv_pages import KVStorage, PagePool, PageTable
from omniwalk.engine.paged_attention import PagedBatch, Segment


def test_pool_allocates_frees_and_refuses_without_side_effects():
    pool = PagePool(num_pages=5, page_size=4)
    a, b = PageTable(), PageTable()
    assert a.reserve(pool, 9)  # 3 pages
    assert pool.num_free == 2
    assert not b.reserve(pool, 13)  # needs 4
    assert pool.num_free == 2 and b.pages == []
    assert b.reserve(pool, 8)
    assert pool.num_free == 0
    a.num_cached = 9
    assert a.pages_needed(pool, 3) == 0 and a.pages_needed(pool, 4) == 1
    a.release(pool)
    assert pool.num_free == 3 and a.num_cached == 0
    with pytest.raises(MemoryError):
        pool.allocate(4)


def test_prefix_pages_are_kept_shared_and_reused_least_recently_used_first():
    """Keyed pages: a released table keys the pages it computed (full pages only), a later table
    takes the longest run of its keys; held pages are never handed out, idle ones count as free and
    go (keys forgotten) oldest first when free pages run out."""
    pool = PagePool(num_pages=6, page_size=4)
    a = PageTable()
    assert a.reserve(pool, 11)  # 3 pages; 2 full ones computed below
    a.num_cached = 11
    first = list(a.pages)
    a.release(pool, [b"k0", b"k1", b"k2"])  # k2's page holds 3 of 4 tokens: not keyed
    assert pool.num_keyed == 2 and pool.num_free == 6 and pool.num_used == 0
    b, c = PageTable(), PageTable()
    b.take_prefix(pool, [b"k0", b"k1", b"zz"])
    c.take_prefix(pool, [b"k0", b"other"])
    assert b.pages == first[:2] and b.num_cached == 8 and c.pages == first[:1] and c.num_cached == 4
    assert pool.num_free == 4  # both keyed pages held
    assert b.reserve(pool, 1) and b.pages[2] not in first[:2]  # its own page past the shared ones
    c.release(pool, [b"k0", b"other"])  # k0 still held by b
    assert pool.num_free == 3 and pool.num_keyed == 2
    b.release(pool, [b"k0", b"k1"])
    assert pool.num_free == 6 and pool.num_keyed == 2
    d = PageTable()
    assert d.reserve(pool, 20)  # the 4 free pages, then the idle keyed one let go of first (k1's)
    assert pool.num_keyed == 1 and first[1] in d.pages and pool.take([b"k1"]) == []
    assert pool.take([b"k0", b"k1"]) == first[:1]  # (held now: not handed out)
    with pytest.raises(MemoryError):
        pool.allocate(1)


def test_slots_follow_pages():
    pool = PagePool(num_pages=8, page_size=4)
    t = PageTable(pages=[5, 2])
    assert t.slots(pool, 2, 6) == [22, 23, 8, 9]


def reference(q, k, v):
    """Causal attention of one sequence, queries = the last len(q) keys."""
    n, m = q.shape[0], k.shape[0]
    mask = torch.arange(m)[None, :] <= torch.arange(m - n, m)[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, enable_gqa=True
    )
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("prefill_backend", ["reference", "masked"])
def test_paged_batch_matches_contiguous_attention_over_steps(prefill_backend):
    """Per request (reference) or one packed varlen call over all requests' keys ("masked" has
    the semantics of the CUDA ``torch_varlen`` kernel): both equal causal attention per request."""
    torch.manual_seed(0)
    heads, kv_heads, d = 4, 2, 8
    storage = KVStorage(
        PagePool(32, 4), num_layers=2, num_kv_heads=kv_heads, head_dim=d, dtype=torch.float32, device="cpu"
    )
    lengths = [[7, 1, 1, 5], [3, 6, 1, 1], [1, 1, 1, 1]]  # per request: chunk sizes step by step
    tables = [PageTable() for _ in lengths]
    history = [([], []) for _ in lengths]  # per request: all keys, values so far (layer 0)
    for step in range(4):
        segments, qs, ks, vs = [], [], [], []
        for r, chunks in enumerate(lengths):
            n = chunks[step]
            assert tables[r].reserve(storage.pool, n)
            segments.append(Segment(tables[r], n))
            qs.append(torch.randn(n, heads, d))
            ks.append(torch.randn(n, kv_heads, d))
            vs.append(torch.randn(n, kv_heads, d))
        batch = PagedBatch(storage, segments, "cpu", prefill_backend=prefill_backend)
        out = batch.attend(0, torch.cat(qs), torch.cat(ks), torch.cat(vs))
        batch.advance(batch.num_tokens)
        start = 0
        for r in range(len(lengths)):
            history[r][0].append(ks[r])
            history[r][1].append(vs[r])
            expected = reference(qs[r], torch.cat(history[r][0]), torch.cat(history[r][1]))
            n = qs[r].shape[0]
            torch.testing.assert_close(out[start : start + n], expected, rtol=1e-5, atol=1e-6)
            start += n
    assert [t.num_cached for t in tables] == [sum(c) for c in lengths]


def test_decode_kernel_reference_reads_pages_and_skips_padding_rows():
    """The batched decode attention (reference backend) equals attention over each row's own keys
    gathered through its page table; a padding row (length 0) writes the scratch slot only and
    returns zeros."""
    from omniwalk.engine.paged_attention import DecodeKV

    torch.manual_seed(0)
    heads, kv_heads, d = 4, 2, 8
    storage = KVStorage(PagePool(16, 4), 1, kv_heads, d, torch.float32, "cpu")
    storage.keys[0].normal_()
    storage.values[0].normal_()
    pages = [[5, 2, 9], [0, 0, 0], [7, 7, 7]]  # rows use the first ceil(len / 4) pages; row 2 is padding
    lens = [10, 3, 0]
    slots = [pages[0][2] * 4 + 1, pages[1][0] * 4 + 2, storage.scratch_slot]
    q, k, v = torch.randn(3, heads, d), torch.randn(3, kv_heads, d), torch.randn(3, kv_heads, d)
    before = storage.keys[0].clone()
    kv = DecodeKV(
        storage, torch.tensor(slots), torch.tensor(pages, dtype=torch.int32), torch.tensor(lens).int(), "reference"
    )
    out = kv.attend(0, q, k, v)
    for row in range(2):
        ids = torch.tensor([p * 4 + i for p in pages[row] for i in range(4)][: lens[row]])
        expected = reference(q[row : row + 1], storage.keys[0][ids], storage.values[0][ids])
        torch.testing.assert_close(out[row : row + 1], expected, rtol=0, atol=1e-6)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    changed = (storage.keys[0] != before).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert changed == sorted(slots)


@pytest.mark.filterwarnings("ignore::UserWarning")
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


@pytest.mark.filterwarnings("ignore::UserWarning")
@torch.no_grad()
def test_a_voice_conversations_next_turn_takes_its_history_from_prefix_pages():
    """Qwen3-Omni tiny: turn 2 of a spoken conversation (turn 1's recording, its answer, a new
    recording; speech out) takes the pages turn 1 left keyed, in the thinker (through the recording:
    its prompt rows for the talker come from beside the keys) and in the talker (its user part), and
    equals a server without the cache; the audio encoder encodes only the new recording. The same
    history with another recording in turn 1 takes only the pages before that recording (both
    encoded). Turn 2 again, its keyed pages taken by other work between its arrival and its
    admission: the skipped recording is encoded late, and the answer is the same."""
    from helpers.qwen3_omni import assert_same as assert_same_speech
    from helpers.qwen3_omni import checkpoint as qwen3_checkpoint

    rng = np.random.default_rng(7)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (16000, 20000, 16000)]  # (1: in 7 pages)
    speech = {"modalities": ["text", "audio"], "voice": "ethan", "max_audio_frames": 6, "min_audio_frames": 6}
    greedy = {"temperature": 0.0, "talker_temperature": 0.0, "code_predictor_temperature": 0.0, "ignore_eos": True}

    def turn(messages: list[dict]) -> dict:
        return {"messages": messages, "max_tokens": 5, **greedy, **speech}

    def user(clip) -> dict:
        return {"role": "user", "content": [{"type": "audio", "audio": clip}, {"type": "text", "text": "and?"}]}

    on, off = Omni(model=qwen3_checkpoint("tiny")), Omni(model=qwen3_checkpoint("tiny"), prefix_cache=False)

    def counts(o: Omni) -> dict[str, int]:
        stats = o.engine.stats()
        return {"thinker": stats["thinker"]["prefix_tokens"], "talker": stats["talker"]["prefix_tokens"]} | {
            "encoded": stats["audio_encoder"]["items_encoded"]
        }

    def run(o: Omni, request: dict, before_steps=lambda req: None):
        before = counts(o)
        req = o.add(request)
        before_steps(req)
        while o.engine.has_unfinished():
            o.engine.step()
        taken = {name: n - before[name] for name, n in counts(o).items()}
        return o.output(req), taken, req.state.thinker.prompt.spans

    first, _, _ = run(on, turn([user(clips[0])]))
    second = [user(clips[0]), {"role": "assistant", "content": first.text}, user(clips[1])]
    (a, taken, spans), b = run(on, turn(second)), off.generate(turn(second))
    assert a.error is None and b.error is None
    assert_same_speech(a, b)
    print(f"turn 2: {taken}; recordings start at {[s.start for s in spans]}")
    assert taken["thinker"] == a.num_cached_tokens >= spans[0].start + spans[0].length  # through recording 1
    assert taken["talker"] > 0
    assert taken["encoded"] == 1  # (recording 1's rows are not read: its pages are taken)
    assert b.num_cached_tokens == 0
    other = [user(clips[2]), {"role": "assistant", "content": first.text}, user(clips[1])]
    c, taken, spans = run(on, turn(other))
    assert c.error is None and taken["thinker"] <= spans[0].start and taken["talker"] == 0
    assert taken["encoded"] == 2

    pool = on.engine.stages["thinker"].pool

    def evict(req) -> None:  # (other work takes every free and idle page: the keys are forgotten)
        assert req.state.media.num_skipped_audio == 1  # (at its arrival, recording 1's pages were keyed)
        pool.free(pool.allocate(pool.num_free))

    d, taken, _ = run(on, turn(second), evict)
    assert d.error is None and taken["thinker"] == 0 and taken["encoded"] == 2
    assert_same_speech(d, b)
    assert on.engine.stats()["audio_encoder"]["requests"] == 0
