"""Tensor parallelism on the CPU (gloo, two processes) against one rank.

- The thinker's logits over a prompt and greedy decode steps, split over two ranks, equal the
  unsplit thinker's within fp32 rounding: |diff| <= 1e-5 with logits up to ~6 (an fp32 ulp there
  is 4.8e-7; measured 2.4e-6: the row-parallel sums and the head's shards add in another order),
  and the greedy ids are equal.
- ``Omni(tensor_parallel=2)`` (rank 0 here, rank 1 a worker process in lockstep) gives the greedy
  ids and codes of ``Omni()`` for concurrent text, media and speech requests, one aborted midway.
- ``omniwalk serve --tensor-parallel 2`` answers the ``openai`` client as one rank does.

Tensor parallelism on two GPUs (NCCL; collectives inside the captured decode and prefill graphs):
TP=2 gives TP=1's greedy ids on the tiny config in fp32, and runs the bf16 fast path (fused MoE on
each rank's slice of the experts, merged projections of its heads) to the end of a speech request."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch
from helpers.live_server import engine_pids, launch
from helpers.qwen3_omni import MESSAGES, REQUESTS, checkpoint, greedy, greedy_speech
from helpers.single_request import thinker_logits

from omniwalk import Omni
from omniwalk.errors import ConfigError
from omniwalk.models.qwen3_omni.checkpoint.loader import load_components
from omniwalk.parallel.layers import ReducedOutput, VocabParallelEmbedding, VocabParallelHead, shard_decoder

HERE = Path(__file__).parent


@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_split_thinker_logits_equal_one_rank_within_fp32_rounding(name, tmp_path):
    one = thinker_logits(0, 1, checkpoint(name))
    cmd = [sys.executable, str(HERE.parent / "helpers" / "single_request.py")]
    args = ["2", str(tmp_path / "store"), checkpoint(name), str(tmp_path / "logits.pt")]
    ranks = [subprocess.Popen([*cmd, str(r), *args]) for r in range(2)]
    assert [p.wait(timeout=300) for p in ranks] == [0, 0]
    two = torch.load(tmp_path / "logits.pt")
    assert two.shape == one.shape and one.abs().max() < 8
    assert torch.equal(two.argmax(-1), one.argmax(-1))
    torch.testing.assert_close(two, one, atol=1e-5, rtol=0)


def test_shard_keeps_one_rank_share_of_every_split_weight():
    full = load_components(checkpoint("uneven"), ("thinker",))["thinker"]
    part = load_components(checkpoint("uneven"), ("thinker",), transform=lambda n, m: shard_decoder(m, 1, 2))["thinker"]
    cfg, d = full.cfg, full.cfg.head_dim
    attn, layer = full.model.layers[0].self_attn, part.model.layers[0]
    assert isinstance(layer.self_attn, ReducedOutput) and isinstance(layer.mlp, ReducedOutput)
    split = layer.self_attn.inner
    assert (split.num_heads, split.num_kv_heads) == (cfg.num_attention_heads // 2, cfg.num_key_value_heads // 2)
    half_q = cfg.num_attention_heads // 2 * d
    assert torch.equal(split.q_proj.weight, attn.q_proj.weight[half_q:])
    assert torch.equal(split.o_proj.weight, attn.o_proj.weight[:, half_q:])
    inter = cfg.moe_intermediate_size
    experts, shard = full.model.layers[0].mlp.experts, layer.mlp.inner.experts
    assert torch.equal(shard.gate_up_proj[:, : inter // 2], experts.gate_up_proj[:, inter // 2 : inter])  # gate
    assert torch.equal(shard.gate_up_proj[:, inter // 2 :], experts.gate_up_proj[:, inter + inter // 2 :])  # up
    assert torch.equal(shard.down_proj, experts.down_proj[:, :, inter // 2 :])
    assert isinstance(part.model.embed_tokens, VocabParallelEmbedding) and isinstance(part.lm_head, VocabParallelHead)
    assert torch.equal(part.lm_head.weight, full.lm_head.weight[cfg.vocab_size // 2 :])
    with pytest.raises(ConfigError, match=r"tensor_parallel 4 must divide the attention heads \(6\)"):
        shard_decoder(load_components(checkpoint("uneven"), ("thinker",))["thinker"], 0, 4)


def _run(omni: Omni, requests: list[dict], abort_after: int | None):
    """Requests added together; the last one aborted after ``abort_after`` steps; outputs of the rest."""
    reqs = [omni.add({**r, "request_id": f"r{i}"}) for i, r in enumerate(requests)]
    steps = 0
    while any(not r.status.is_done for r in reqs):
        omni.step()
        steps += 1
        if steps == abort_after:
            assert omni.abort(reqs[-1].id)
    return [omni.output(r) for r in reqs[:-1]]


@pytest.mark.parametrize("name", ["tiny", "uneven"])
def test_two_ranks_give_the_ids_and_codes_of_one(name):
    requests = [
        greedy(24),
        {**REQUESTS["image_audio_image"], "max_tokens": 12, "min_tokens": 12, "temperature": 0.0},
        greedy_speech(REQUESTS["audio"]["messages"]),
        {**greedy(16), "temperature": 0.8, "top_p": 0.9},  # unseeded: rank 0 draws the seed for every rank
        greedy(400),  # aborted
    ]
    split = Omni(model=checkpoint(name), tensor_parallel=2)
    try:
        two = _run(split, requests[:3] + [requests[4]], abort_after=5)
        # unseeded: rank 0 draws the seed and sends it; a rank with a seed of its own would draw other
        # tokens and add rows of other embeddings to rank 0's (each rank looks up its share of the ids)
        unseeded = split.add(requests[3])
        while not unseeded.status.is_done:
            split.step()
        unseeded_ids, seed = split.output(unseeded).token_ids, unseeded.state.thinker.sampler.seed
        # a speech request after text requests left keyed prefix pages: rank 1 (no talker) must take
        # none either, or the ranks' schedules part (LockstepError)
        assert split.engine.stages["thinker"].num_prefix_tokens > 0
        speech = split.add({**requests[2], "request_id": "later"})
        while not speech.status.is_done:
            split.step()
        later = split.output(speech)
    finally:
        split.close()
    one_omni = Omni(model=checkpoint(name))
    one = _run(one_omni, requests[:3] + [requests[4]], abort_after=5)
    for a, b in zip(two, one, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    assert torch.equal(two[2].codes, one[2].codes) and two[2].codes.shape[0] > 0
    assert unseeded_ids == one_omni.generate({**requests[3], "seed": seed}).token_ids
    alone = one_omni.generate({**requests[2], "request_id": "later"})
    assert later.error is None and later.token_ids == alone.token_ids and torch.equal(later.codes, alone.codes)


def test_server_with_two_ranks_answers_as_one():
    expected = Omni(model=checkpoint("tiny")).generate(greedy(8)).text
    proc, base = launch("--tensor-parallel", "2")
    try:
        (engine,) = engine_pids(proc.pid)
        children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(engine)], capture_output=True, text=True)
        workers = [int(line.split()[0]) for line in children.stdout.splitlines() if "omniwalk.parallel.worker" in line]
        assert len(workers) == 1, children.stdout
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="qwen3-omni", messages=MESSAGES, max_tokens=8, temperature=0)
        assert reply.choices[0].message.content == expected
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    time.sleep(1)
    assert not Path(f"/proc/{workers[0]}").exists(), "the worker outlived the server"


def test_tensor_parallel_must_divide_and_be_positive():
    with pytest.raises(ConfigError, match="tensor_parallel must be >= 1"):
        Omni(model=checkpoint("tiny"), tensor_parallel=0)


def test_a_follower_takes_the_leaders_steps_and_stops_when_its_state_differs(monkeypatch):
    """The lockstep protocol without processes: a one-rank engine fed rank 0's step messages."""
    from omniwalk.parallel import lockstep

    leader, follower_omni = Omni(model=checkpoint("tiny")), Omni(model=checkpoint("tiny"))
    request = {**greedy(6), "request_id": "a", "seed": 1}
    leader.add(request)
    leader.step()
    after_one = lockstep.fingerprint(leader.engine, ("thinker",))
    messages = iter([lockstep.Step([("add", request)], 0), lockstep.Step([], after_one), lockstep.Step([], 12345)])
    monkeypatch.setattr(lockstep, "_broadcast", lambda obj: next(messages))
    monkeypatch.setattr(lockstep, "_common_stages", lambda names: ("thinker",))
    follower = lockstep.Follower(follower_omni)
    with pytest.raises(lockstep.LockstepError, match="diverged from rank 0"):
        follower.run()
    prompt = leader.engine.requests["a"].state.thinker.prompt.num_prompt_tokens
    assert follower_omni.engine.stages["thinker"].tables["a"].num_cached == prompt + 1  # its two steps: prompt, a token


def _generate(requests, **options):
    omni = Omni(model=checkpoint("tiny"), device="cuda", **options)
    try:
        return omni.generate(requests)
    finally:
        omni.close()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpu_ranks_give_the_greedy_ids_of_one():
    requests = [greedy(32), {**REQUESTS["image_audio_image"], "max_tokens": 12, "min_tokens": 12, "temperature": 0.0}]
    one = _generate(requests, dtype="float32")
    two = _generate(requests, dtype="float32", tensor_parallel=2)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]


def _same_ids_or_a_near_tie(one, two) -> bool:
    """TP=2's greedy ids against TP=1's in bf16 (the all-reduce sums in another order than one GEMM, so the
    logits round differently): equal, or parting first where TP=1's top-2 logprobs are within 0.05 (a near
    tie), with the chosen tokens' logprobs within 0.05 of each other up to there. True where all are equal."""
    for k, (a, b) in enumerate(zip(one.token_ids, two.token_ids, strict=True)):
        if a != b:
            top = one.logprobs[k].top
            assert top[0][1] - top[1][1] < 0.05, f"ids part at {k} with a top-2 logprob gap of {top[0][1] - top[1][1]}"
            return False
        assert abs(one.logprobs[k].logprob - two.logprobs[k].logprob) < 0.05, (k, one.logprobs[k], two.logprobs[k])
    return True


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpu_ranks_run_the_bf16_fast_path_with_graphs_and_match_one():
    """The bf16 fast path with graphs at TP=2 against TP=1, a text and a speech request: the same greedy ids
    (or a near tie, proven), and for speech, where the ids are equal, the same codes and audio (the talker
    and vocoder run on rank 0 alone, fed the thinker's rows)."""
    extra = {"logprobs": True, "top_logprobs": 2}
    requests = [greedy(32, **extra), greedy_speech(REQUESTS["audio"]["messages"], **extra)]
    one = _generate(requests, dtype="bfloat16")
    two = _generate(requests, dtype="bfloat16", tensor_parallel=2)
    for x, y in zip(one, two, strict=True):
        assert x.error is None and y.error is None and len(y.token_ids) == len(x.token_ids) > 0
    text, speech = zip(one, two, strict=True)
    _same_ids_or_a_near_tie(*text)
    if _same_ids_or_a_near_tie(*speech):
        x, y = speech
        assert y.codes.shape == x.codes.shape and x.codes.shape[0] > 0
        parted = (x.codes != y.codes).any(dim=1).nonzero()
        assert len(parted) == 0, f"ids equal, codes differ first at frame {int(parted[0])}"
        assert torch.equal(y.audio, x.audio)  # the same vocoder on rank 0, the same codes
