"""Qwen2.5-Omni's decode graphs on the GPU (tiny model, bf16): the thinker's (speech rows included,
returning their hidden states and embeddings for the talker) and the talker's (projection, talker
decode, codec head), with the encoders' layer graphs, graphs on against graphs off through the engine
on a mixed workload of every input path (the encoders' graphs off in the eager run). No prefill
graphs (their padded layouts are other GEMM shapes, tested on their own in ``engine/test_graphs_gpu.py``)."""

import pytest
import torch
from helpers.qwen2_5_omni import checkpoint, make_request

from omniwalk import Omni

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning")]


def _omni(graphs: int, encoder_graphs: int) -> Omni:
    return Omni(
        model=checkpoint("tiny"),
        device="cuda",
        dtype="bfloat16",
        cuda_graph_max_batch=graphs,
        encoder_graph_max_tokens=encoder_graphs,
        prefill_graph_max_tokens=0,
    )


def test_decode_graphs_equal_eager_through_the_engine():
    """Same 16 requests (4 speech), graphs on and off: ids equal except where a padded bucket's
    GEMMs break a near tie (then the eager top-2 gap must be tiny); where a speech request's ids are
    equal its talker reads rows equal to GEMM rounding, so its codes may differ only at a near tie
    too: at least half of them must be equal, with audio of the same length and waveform cosine >= 0.999
    (token2wav's DiT layers run in bf16 in a bf16 model; the bf16 DiT against fp32: 0.999997)."""
    requests = [{**make_request(i), "logprobs": True, "top_logprobs": 2} for i in range(16)]
    eager, graphed = _omni(0, 0), _omni(8, 8192)
    a, b = eager.generate(requests), graphed.generate(requests)
    stats = graphed.engine.stats()
    print(f"GPU-Q25-GRAPHS stats thinker={stats['thinker']} talker={stats['talker']}")
    assert stats["thinker"]["graph_replays"] > 0 and stats["talker"]["graph_replays"] > 0
    assert stats["audio_encoder"]["graph_replays"] > 0  # (the shared graphed audio program)
    assert stats["vision_encoder"]["graph_replays"] > 0  # (runs of window blocks)
    assert eager.engine.stats()["talker"]["graph_replays"] == 0
    assert eager.engine.stats()["vision_encoder"]["graph_replays"] == 0
    same_ids, same_codes, speech = 0, 0, 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.error is None and y.error is None
        if x.token_ids != y.token_ids:
            k = next(j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=True)) if s != t)
            top = x.logprobs[k].top
            print(f"GPU-Q25-GRAPHS request {i}: ids differ first at {k}; eager top-2 gap {top[0][1] - top[1][1]:.4f}")
            assert top[0][1] - top[1][1] < 0.05
            continue
        same_ids += 1
        if x.codes is not None:
            speech += 1
            same_codes += x.codes == y.codes
            print(f"GPU-Q25-GRAPHS request {i}: codes equal {x.codes == y.codes} ({len(x.codes)} codes)")
            if x.codes == y.codes:  # (the DiT runs in bf16 here: a graph's padded rows round its GEMMs apart)
                assert x.audio.shape == y.audio.shape
                assert torch.nn.functional.cosine_similarity(x.audio.double(), y.audio.double(), dim=0) >= 0.999
    assert same_ids >= 12 and 2 * same_codes >= speech
