"""The engine-core toy: a real one-layer attention LM whose keys and values live in the paged KV, its KV
program, and drivers that run a workload staggered or each request alone."""

import random

import torch

from omniwalk.engine.engine import Engine, EngineLimits
from omniwalk.engine.kv_pages import KVStorage, PagePool
from omniwalk.engine.kv_stage import KVProgram, KVStage, KVStageConfig
from omniwalk.engine.request import EngineRequest

VOCAB, DIM, HEADS = 64, 32, 2


class ToyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.randn(VOCAB, DIM, generator=g)
        self.qkv = torch.randn(DIM, 3 * DIM, generator=g) / DIM**0.5
        self.head = torch.randn(DIM, VOCAB, generator=g)


class ToyProgram(KVProgram):
    """Prompt ids -> greedy tokens; ``seq`` = prompt + generated, KV holds ``seq[:num_cached]``."""

    def __init__(self, model, fail_on: set[str] = frozenset()):
        self.model, self.fail_on = model, fail_on

    def num_ready(self, req, num_cached):
        return len(req.state["seq"]) - num_cached

    def run(self, batch, kv):
        if any(req.id in self.fail_on for req, _, _ in batch):
            raise RuntimeError("injected failure")
        ids = torch.tensor([t for req, start, n in batch for t in req.state["seq"][start : start + n]])
        x = self.model.embed[ids]
        q, k, v = (x @ self.model.qkv).view(len(ids), 3, HEADS, DIM // HEADS).unbind(1)
        h = kv.attend(0, q, k, v).reshape(len(ids), DIM) + x
        kv.advance(len(ids))
        logits = h @ self.model.head
        ends = torch.tensor([n for _, _, n in batch]).cumsum(0) - 1
        for (req, start, n), token in zip(batch, logits[ends].argmax(-1).tolist(), strict=True):
            if start + n == len(req.state["seq"]):  # the chunk reached the end: sample
                self.commit(req, token)

    def commit(self, req, token):
        req.state["seq"].append(token)
        req.emit("text", token)

    def is_finished(self, req):
        return len(req.state["seq"]) >= req.state["stop_at"]

    def on_preempt(self, req):
        req.state["preempted"] = req.state.get("preempted", 0) + 1


def make_engine(num_pages=256, max_batch_tokens=64, fail_on=frozenset(), max_requests=256):
    storage = KVStorage(PagePool(num_pages, 4), 1, HEADS, DIM // HEADS, torch.float32, "cpu")
    stage = KVStage("lm", ToyProgram(ToyLM(), fail_on), storage, KVStageConfig(max_batch_tokens, 64), "cpu")
    return Engine([stage], EngineLimits(max_requests)), stage


def make_request(rid, prompt_len, max_new, seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    return EngineRequest(rid, ("lm",), {"seq": list(prompt), "stop_at": prompt_len + max_new})


def generated(req):
    return [e.data for e in req.events if e.kind == "text"]


def run_alone(prompt_len, max_new, seed):
    engine, _ = make_engine()
    req = make_request("solo", prompt_len, max_new, seed)
    engine.add(req)
    while engine.has_unfinished():
        engine.step()
    return generated(req)


def workload(n=12):
    rng = random.Random(1)
    return [(f"r{i}", rng.randint(1, 40), rng.randint(1, 20), i) for i in range(n)]


def drive(engine, specs, stagger=2, on_step=None):
    reqs, pending, steps = {}, list(specs), 0
    while pending or engine.has_unfinished():
        if pending and steps % stagger == 0:
            rid, p, m, s = pending.pop(0)
            reqs[rid] = make_request(rid, p, m, s)
            engine.add(reqs[rid])
        engine.step()
        if on_step:
            on_step(steps, reqs)
        steps += 1
    return reqs
