"""Prefill graphs (``engine/prefill_graphs.py``) on the CPU: the padded layout, and the programs'
graph path run eagerly over it (a stand-in replaces the CUDA capture), equal to the eager path."""

import pytest
import torch
from helpers.qwen3_omni import PATHS, alone, assert_same, checkpoint, make_request, run_staggered
from helpers.replay import EagerReplay

from omniwalk import Omni
from omniwalk.engine import prefill_graphs
from omniwalk.engine.kv_pages import KVStorage, PagePool, PageTable
from omniwalk.engine.packed_graphs import Bucket
from omniwalk.engine.paged_attention import PagedBatch, Segment
from omniwalk.engine.prefill_graphs import PrefillKV, PrefillPlan, fits, kv_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _storage():
    torch.manual_seed(0)
    storage = KVStorage(PagePool(64, 4), 1, 2, 8, torch.float32, "cpu")
    storage.keys[0].normal_()
    storage.values[0].normal_()
    return storage


def _segments(storage, cached_and_new):
    segments = []
    for cached, new in cached_and_new:
        table = PageTable()
        table.reserve(storage.pool, cached + new)
        table.num_cached = cached
        segments.append(Segment(table, new))
    return segments


def test_padded_layout_attends_like_the_unpadded_step():
    """Chunks after cached keys and first chunks, padded to a bucket: the real rows' attention
    output is the unpadded step's; padding writes only the scratch slot."""
    storage = _storage()
    segments = _segments(storage, [(5, 3), (0, 6), (9, 1)])
    bucket = Bucket(32, 4, 16)
    kv = PagedBatch(storage, segments, "cpu", prefill_backend="reference")
    assert fits(bucket, kv) and not fits(Bucket(12, 4, 12), kv)  # 14 cached keys: more than T
    inputs = kv_inputs(bucket, storage, segments, "cpu")
    assert inputs["new_slots"].shape == (32,) and inputs["key_slots"].shape == (64,)
    assert inputs["cu_q"].tolist()[:5] == [0, 3, 9, 10, 26] and inputs["cu_q"][-1] == 32
    assert inputs["cu_k"].tolist()[:5] == [0, 8, 14, 24, 40] and inputs["cu_k"][-1] == 46
    q, k, v = (torch.randn(32, h, 8) for h in (4, 2, 2))
    expected = kv.attend(0, q[:10], k[:10], v[:10])
    keys_after = storage.keys[0].clone()
    padded = PrefillKV(storage, *inputs.values(), bucket.max_seqlen, 64, "reference")
    got = padded.attend(0, q, k, v)
    torch.testing.assert_close(got[:10], expected, rtol=0, atol=1e-6)  # (SDPA with a mask vs per-segment causal)
    changed = (storage.keys[0] != keys_after).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert changed == [storage.scratch_slot]


def test_prefill_graph_path_equals_eager_through_the_engine(monkeypatch):
    """Every path (DeepStack rows for images, talker prefixes, chunks after cached tokens with a
    small budget), its prefill run through the padded graph path: the same ids, codes and audio as
    each request alone on the eager path."""
    monkeypatch.setattr(prefill_graphs, "KeyedGraphs", EagerReplay)
    o = Omni(model=checkpoint("tiny"), max_batch_tokens=256, talker_max_batch_tokens=256)
    for name in ("thinker", "talker"):
        stage = o.engine.stages[name]
        stage.program.prefill = PrefillPlan(256, "reference")
        stage.capture_graphs()
    requests = [make_request(i, PATHS[i % len(PATHS)]) for i in range(12)]
    outs = run_staggered(o, requests)
    for i, request in enumerate(requests):
        assert_same(outs[request["request_id"]], alone(i))
    stats = o.engine.stats()
    assert stats["thinker"]["prefill_graph_replays"] > 0 and stats["talker"]["prefill_graph_replays"] > 0
