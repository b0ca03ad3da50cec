"""The price of a grammar per decode step: B requests in steady decode, free, constrained and mixed.

    python benchmarks/structured/constrained_steps.py CHECKPOINT --out DIR [--batches 1,32] [--option NAME=VALUE]
        [--fill engine|parallel] [--profile]

On CUDA the model is ``harness.FULL_OPTIONS`` (full size from a weightless skeleton, random bf16 weights);
on the CPU a checkpoint in float32. Three batches of B requests, in rounds that alternate them (drift
falls on all alike):

    free         no grammar (EOS ignored: every request decodes the whole window)
    constrained  every request's answer is a JSON document {"text": "..."} with a long string, so it
                 stays in the string for the window (a random-weight model seldom draws the closing
                 quote) and every step fills a mask over the whole vocabulary
    mixed        half of each

Each figure is the median wall time of an engine step once every request is decoding (the step
launches, waits for the step before and commits it: the inter-token latency a client sees), beside
the host time spent filling the steps' bitmasks. A constrained step draws after the step before
is committed, while the forward runs (``engine/inflight.py``): the mask costs time only where it
outlasts the forward. Writes constrained_steps.json and .md.

``--fill parallel`` fills the masks with the grammar engine's parallel fill (its own worker
threads) instead of the package's ``matchers.bitmask`` (one row after another on the engine thread),
to compare the two; ``--profile`` writes the torch profiler's host and device tables of a few steps
of each mode at the largest batch (profile_*.txt).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import llguidance
import llguidance.numpy
import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import FULL_OPTIONS, add_option_argument, int_list, machine, prompt_text, synchronize  # noqa: E402

from omniwalk import Omni  # noqa: E402
from omniwalk.models.common.programs import thinker_program  # noqa: E402
from omniwalk.sampling import bitmask_width  # noqa: E402

CPU_OPTIONS = dict(device="cpu", dtype="float32")
MODES = ("free", "constrained", "mixed")
LONG_TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 100_000}},
    "required": ["text"],
    "additionalProperties": False,
}


class MaskClock:
    """Host seconds in the thinker's bitmask fills (wraps the function the thinker program calls)."""

    def __init__(self, fill: str):
        self.seconds, self.calls = 0.0, 0
        self._fill = thinker_program.bitmask if fill == "engine" else parallel_fill
        thinker_program.bitmask = self

    def __call__(self, states):
        start = time.perf_counter()
        try:
            return self._fill(states)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


@functools.cache
def _executor() -> llguidance.LLExecutor:
    return llguidance.LLExecutor()


def parallel_fill(states) -> np.ndarray:
    """``matchers.bitmask`` with the rows filled by the grammar engine's worker threads."""
    grammars = next(g for g in states if g is not None).grammars
    mask = np.full((len(states), bitmask_width(grammars.vocab)), -1, dtype=np.int32)
    rows = [(g.matcher, row) for row, g in enumerate(states) if g is not None and g.is_live]
    llguidance.numpy.fill_next_token_bitmask_par(_executor(), rows, mask)
    return mask


def requests(batch: int, mode: str, window: int, round_: int) -> list[dict]:
    out = []
    for i in range(batch):
        constrained = mode == "constrained" or (mode == "mixed" and i % 2 == 1)
        fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": LONG_TEXT}}}
        out.append(
            {
                "request_id": f"{mode}-{batch}-{round_}-{i}",
                "messages": [{"role": "user", "content": prompt_text(i)}],
                "max_tokens": window,
                "temperature": 1.0,
                "seed": 1000 * round_ + i,
                **(fields if constrained else {"ignore_eos": True}),
            }
        )
    return out


def measure(omni: Omni, clock: MaskClock, batch: int, mode: str, steps: int, warmup: int, round_: int) -> dict:
    """Median step time with all ``batch`` requests decoding, and the mask time per step."""
    reqs = [omni.add(r) for r in requests(batch, mode, steps + warmup + 8, round_)]
    thinker = lambda r: r.state.thinker  # noqa: E731
    while not all(thinker(r).num_generated >= 2 for r in reqs):  # prefill done, decode steady
        omni.step()
    for _ in range(warmup):
        omni.step()
    synchronize(omni.config.model.device)
    times, mask_before = [], clock.seconds
    for _ in range(steps):
        if any(r.status.is_done or thinker(r).is_finished for r in reqs):
            break  # (a document closed early: the batch is no longer B; later steps are left out)
        start = time.perf_counter()
        omni.step()
        times.append(time.perf_counter() - start)
    while omni.engine.has_unfinished():
        for r in reqs:
            omni.abort(r.id)
        omni.step()
    mask_ms = (clock.seconds - mask_before) * 1e3 / max(len(times), 1)
    return {"step_ms": statistics.median(times) * 1e3, "mask_ms_per_step": mask_ms, "steps": len(times)}


def profile(omni: Omni, clock: MaskClock, batch: int, mode: str, warmup: int, out: Path) -> None:
    """The torch profiler's tables (host self time; device time) over 8 steady steps of one mode."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        measure(omni, clock, batch, mode, 8, warmup, round_=99)
    table = prof.key_averages()
    text = table.table(sort_by="self_cpu_time_total", row_limit=40)
    if torch.cuda.is_available():
        text += "\n" + table.table(sort_by="self_cuda_time_total", row_limit=25)
    (out / f"profile_{batch}_{mode}.txt").write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint or weightless skeleton directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="picks the defaults")
    p.add_argument("--batches", type=int_list, default=[1, 32])
    p.add_argument("--steps", type=int, default=32, help="timed steps per figure")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--fill", choices=("engine", "parallel"), default="engine", help="how masks are filled (see above)")
    p.add_argument("--profile", action="store_true", help="profile a few steps of each mode at the largest batch")
    add_option_argument(p, "Omni")
    args = p.parse_args()
    is_cuda = torch.device(args.device).type == "cuda"
    options = {**(FULL_OPTIONS if is_cuda else CPU_OPTIONS), **dict(args.option)}
    start = time.perf_counter()
    omni = Omni(model=args.model, **options)
    print(f"model built in {time.perf_counter() - start:.1f} s", flush=True)
    clock = MaskClock(args.fill)
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for b in args.batches:
            for mode in MODES:
                cell = measure(omni, clock, b, mode, args.steps, args.warmup, r)
                runs.setdefault(f"{b}/{mode}", []).append(cell)
                print(
                    f"round {r} B={b} {mode}: step {cell['step_ms']:.2f} ms, mask {cell['mask_ms_per_step']:.2f} "
                    f"ms/step ({cell['steps']} steps)",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        for mode in MODES:
            profile(omni, clock, max(args.batches), mode, args.warmup, args.out)
    rows = []
    for b in args.batches:
        free = statistics.median(c["step_ms"] for c in runs[f"{b}/free"])
        for mode in MODES:
            cells = runs[f"{b}/{mode}"]
            step = statistics.median(c["step_ms"] for c in cells)
            mask = statistics.median(c["mask_ms_per_step"] for c in cells)
            rows.append({"batch": b, "mode": mode, "step_ms": step, "mask_ms_per_step": mask, "vs_free": step / free})
    result = {
        "machine": machine(options["device"]),
        "options": options,
        "args": vars(args) | {"out": str(args.out)},
        "rows": rows,
        "runs": runs,
    }
    (args.out / "constrained_steps.json").write_text(json.dumps(result, indent=1, default=str))
    lines = ["| B | requests | step (ms) | mask fill (ms/step) | step / free |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['batch']} | {r['mode']} | {r['step_ms']:.2f} | {r['mask_ms_per_step']:.2f} | {r['vs_free']:.3f} |"
        for r in rows
    ]
    (args.out / "constrained_steps.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
