"""Tensor-parallel ranks run the same deterministic schedule: rank 0 (the engine) tells the other
ranks, once per step, what changed since the last one, and every rank then takes the same step.

    rank 0 (Leader)                                  rank r > 0 (Follower)
    Omni.add / abort: ops recorded, in order         wait for the step message
    step: broadcast Step(ops, fingerprint)  ───────► check the fingerprint, apply the ops (add, abort)
          engine.step()  ◄──── collectives ────►     engine.step()
          ops += requests that failed in it

Why this and not rank 0 broadcasting each forward's inputs: the schedule (admission, chunking,
preemption, KV pages, CUDA graph buckets) is a pure function of the requests and the step count,
so the same engine code on every rank makes the same choices, with one small host message per
step and no second code path through the programs. A follower builds only the stages the split
model needs (the family's choice, e.g. encoders and thinker with text-only requests), so its
requests finish earlier; it never refuses one (rank 0 admitted it). What keeps ranks equal:
every rank gets the same requests in the same order before the same step, an unseeded request
gets its seed from rank 0, and the logits are gathered whole on every rank, so every rank draws
the same tokens. What breaks it is a failure on one rank alone (not a property of the request):
then the fingerprint of the split stages' KV state (request ids and cached token counts), sent
with the next step, differs and the follower stops with ``LockstepError`` (rank 0's next
collective then fails: the engine process exits, see ``serve/supervisor.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import subprocess
from dataclasses import dataclass, field

import torch.distributed as dist

from omniwalk.engine.request import Status
from omniwalk.errors import OmniwalkError
from omniwalk.parallel import ranks


class LockstepError(OmniwalkError):
    """A follower rank's state is not rank 0's any more."""


@dataclass
class Step:
    ops: list[tuple[str, object]] = field(default_factory=list)  # ("add", request dict) | ("abort", id)
    fingerprint: int = 0  # of the split stages after the step before


def fingerprint(engine, stage_names) -> int:
    """The KV stages' requests and cached tokens (what the next step's schedule is made from)."""
    state = []
    for name in stage_names:
        tables = getattr(engine.stages[name], "tables", {})
        state.append((name, tuple(sorted((rid, t.num_cached) for rid, t in tables.items()))))
    return int.from_bytes(hashlib.blake2b(repr(state).encode(), digest_size=8).digest())  # (str hashes vary by process)


def _broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ranks.control_group())
    return box[0]


class Leader:
    def __init__(self, workers: list, tmpdir):
        self.workers, self.tmpdir = workers, tmpdir
        self.step = Step()
        self.shared: tuple[str, ...] = ()  # the stages every rank has
        self.last_fingerprint = 0

    def joined(self, stage_names) -> None:
        """After every rank built its engine: learn which stages they all have."""
        self.shared = _common_stages(stage_names)

    def admit(self, request: dict, request_id: str) -> dict:
        """The request as every rank takes it: its id, and a seed drawn here when it has none."""
        seed = request.get("seed")
        return {**request, "request_id": request_id, "seed": random.randrange(2**62) if seed is None else seed}

    def added(self, request: dict) -> None:
        self.step.ops.append(("add", request))

    def aborted(self, request_id: str) -> None:
        self.step.ops.append(("abort", request_id))

    def run_step(self, engine) -> bool:
        step, self.step = self.step, Step()
        step.fingerprint = self.last_fingerprint
        _broadcast(step)
        before = dict(engine.requests)
        worked = engine.step()
        for rid, req in before.items():  # failed here (in a stage the followers may not have): they drop it too
            if rid not in engine.requests and req.status is Status.FAILED:
                self.step.ops.append(("abort", rid))
        self.last_fingerprint = fingerprint(engine, self.shared)
        return worked

    def close(self) -> None:
        if dist.is_initialized():
            with contextlib.suppress(RuntimeError):  # (a worker that failed to start is gone already)
                _broadcast(None)
        for w in self.workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class Follower:
    def __init__(self, omni):
        self.omni = omni
        self.shared = _common_stages(tuple(omni.engine.stages))
        self.last_fingerprint = 0

    def run(self) -> None:
        """Take rank 0's steps until it stops."""
        engine = self.omni.engine
        while (step := _broadcast(None)) is not None:
            if step.fingerprint != self.last_fingerprint:
                raise LockstepError(f"rank {ranks.rank()} diverged from rank 0 (its KV state differs)")
            for kind, arg in step.ops:
                if kind == "add":
                    self.omni.add(arg)
                else:
                    self.omni.abort(arg)
            engine.step()
            self.last_fingerprint = fingerprint(engine, self.shared)


def _common_stages(names) -> tuple[str, ...]:
    """Every rank's stage names -> those all ranks have, in rank 0's order (a collective)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, tuple(names), group=ranks.control_group())
    return tuple(n for n in everyone[0] if all(n in other for other in everyone))
