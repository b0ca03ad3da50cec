"""Where one request's time to first text goes, in process (no HTTP), engine step by engine step.

    python benchmarks/engine/ttft_probe.py SKELETON --paths s2t,i2t --out DIR
    python benchmarks/engine/ttft_probe.py /tmp/tiny --device cpu --paths s2t --repeats 2 --out DIR

For each path (the bench presets' inputs), after two requests run to the end (warm-up), a request is
added alone ``--repeats`` times and the engine stepped until it has text out, then aborted:

    free      wall ms from ``Omni.add`` to the step that finds text (the engine TTFT of profile_walk.py),
              of which ``add`` (the request's host processing) and the steps
    clocked   the same with every stage's step() + finish() synchronised and timed (micro_clock.py's
              StageClock): ms per stage in each engine step up to the first text
    profiled  once more under the torch profiler (CUDA): GPU busy (the union of kernel intervals) over the
              window's wall time, kernels by kind and the top kernels
    to end    (``--whole``) 2 x repeats requests alone from add to their end, nothing synchronised: wall ms
    whole     (``--whole``) one request from add to its end under the profiler (host and CUDA): per engine
              step its host ms and the GPU range of the kernels it launched, the GPU's idle gaps over
              30 µs; the Chrome trace as ``whole-PATH.json.gz``

Writes ``ttft.json`` and ``ttft.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import FULL_OPTIONS, add_option_argument, markdown_table, synchronize  # noqa: E402
from micro import CPU_OPTIONS  # noqa: E402
from micro_clock import StageClock, _is_kernel  # noqa: E402
from profile_walk import kind_of, union_us  # noqa: E402

from omniwalk import Omni  # noqa: E402
from omniwalk.bench.workload import PRESETS, request_body  # noqa: E402


def first_text(omni: Omni, body: dict, device) -> dict:
    """Add ``body`` alone, step until it has text out, abort it and drain -> {add_ms, ms, steps, step_ms}."""
    synchronize(device)
    start = time.perf_counter()
    req = omni.add(body)
    added = time.perf_counter()
    step_ms = []
    while not any(e.kind == "text" for e in req.events):
        if req.status.is_done:
            raise RuntimeError(f"request {req.id} ended without text: {req.error!r}")
        t = time.perf_counter()
        omni.engine.step()
        step_ms.append((time.perf_counter() - t) * 1e3)
    row = dict(add_ms=(added - start) * 1e3, ms=(time.perf_counter() - start) * 1e3, steps=len(step_ms))
    omni.abort(req.id)
    while omni.engine.has_unfinished():
        omni.engine.step()
    return row | {"step_ms": step_ms}


def to_end(omni: Omni, body: dict, device) -> float:
    """Wall ms from adding ``body`` alone to its end (the in-process end-to-end time)."""
    synchronize(device)
    start = time.perf_counter()
    req = omni.add(body)
    while not req.status.is_done:
        omni.engine.step()
    return (time.perf_counter() - start) * 1e3


def whole(omni: Omni, body: dict, device, trace: Path) -> dict:
    """``body`` alone from add to its end under the profiler -> per-step host/GPU ms and the GPU's idle gaps."""
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("ttft:add"):
            req = omni.add(body)
        while not req.status.is_done:
            with record_function("ttft:step"):
                omni.engine.step()
        synchronize(device)
    raw = trace.with_suffix("")  # (the profiler writes plain JSON; kept gzipped)
    prof.export_chrome_trace(str(raw))
    trace.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    marks = [e for e in prof.events() if e.name.startswith("ttft:")]
    host = sorted((e.time_range.start, e.time_range.end) for e in marks if e.device_type == DeviceType.CPU)
    # the profiler's GPU ranges of the same marks: from the first to the last kernel each host span launched
    on_gpu = sorted((e.time_range.start, e.time_range.end) for e in marks if e.device_type == DeviceType.CUDA)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if _is_kernel(e))
    origin = host[0][0]
    rows = [[i, round((a - origin) / 1e3, 3), round((b - a) / 1e3, 3)] for i, (a, b) in enumerate(host)]
    ranges = []
    for c, d in on_gpu:
        inside = sum(1 for a, _ in kernels if c <= a < d)
        ranges.append([round((c - origin) / 1e3, 3), round((d - c) / 1e3, 3), inside])
    gaps, end = [], None
    for a, b in kernels:
        if end is not None and a - end > 30:
            gaps.append([round((end - origin) / 1e3, 3), round(a - end, 1)])
        end = b if end is None else max(end, b)
    return {
        "wall_ms": (max(host[-1][1], end or 0.0) - origin) / 1e3,
        "busy_ms": union_us(kernels) / 1e3,
        "first_kernel_ms": (kernels[0][0] - origin) / 1e3 if kernels else None,
        "kernels": len(kernels),
        "steps": rows,
        "gpu_ranges": ranges,
        "gaps": gaps,
    }


def probe(omni: Omni, path: str, repeats: int, device, trace_dir: Path | None = None) -> dict:
    bodies = [request_body(PRESETS[path], "omni", seed) | {"request_id": f"ttft-{path}-{seed}"} for seed in range(2)]
    for body in bodies:  # warm-up: every stage of the path runs, to the end
        req = omni.add({**body, "request_id": body["request_id"] + "-warm"})
        while not req.status.is_done:
            omni.engine.step()
    n = itertools.count()

    def body() -> dict:
        i = next(n)
        return {**bodies[i % 2], "request_id": f"ttft-{path}-{i}"}

    free = [first_text(omni, body(), device) for _ in range(repeats)]
    clocked = []
    for _ in range(repeats):
        with StageClock(omni.engine, device) as clock:
            row = first_text(omni, body(), device)
        steps = row["steps"]  # (the abort's drain steps come after: only the first `steps` are the TTFT's)
        row["stages"] = {name: [round(ms, 3) for ms in v[:steps]] for name, v in clock.ms.items() if any(v[:steps])}
        clocked.append(row)
    out = {"path": path, "free": free, "clocked": clocked}
    if device.type == "cuda":
        synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            row = first_text(omni, body(), device)
            synchronize(device)
        kernels = [e for e in prof.events() if _is_kernel(e)]
        busy = union_us([(e.time_range.start, e.time_range.end) for e in kernels])
        by_kind, by_name = defaultdict(float), defaultdict(lambda: [0, 0.0])
        for e in kernels:
            by_kind[kind_of(e.name)] += e.time_range.elapsed_us()
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.time_range.elapsed_us()
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]
        out["profiled"] = {
            "ms": row["ms"],
            "busy_ms": busy / 1e3,
            "kernels": len(kernels),
            "by_kind_ms": {k: v / 1e3 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[name[:90], count, us / 1e3] for name, (count, us) in top],
        }
    if trace_dir is not None:
        out["to_end_ms"] = [to_end(omni, body(), device) for _ in range(2 * repeats)]
        out["whole"] = whole(omni, body(), device, trace_dir / f"whole-{path}.json.gz")
    return out


def report(rows: list[dict]) -> str:
    lines = ["# Time to first text, in process (ttft_probe.py)", ""]
    for r in rows:
        free = r["free"]
        p50 = statistics.median(x["ms"] for x in free)
        lines.append(f"## {r['path']}")
        lines.append("")
        lines.append(
            f"- free: TTFT p50 {p50:.1f} ms over {len(free)} requests ({[round(x['ms'], 1) for x in free]}); "
            f"add (host processing) p50 {statistics.median(x['add_ms'] for x in free):.2f} ms; engine steps "
            f"{[x['steps'] for x in free]}, ms per step {[[round(s, 1) for s in x['step_ms']] for x in free[:2]]}"
        )
        c = r["clocked"][-1]
        names = sorted(c["stages"])
        table = [
            [i + 1, round(c["step_ms"][i], 2), *[c["stages"][n][i] if i < len(c["stages"][n]) else "" for n in names]]
            for i in range(c["steps"])
        ]
        head = f"clocked (the last of {len(r['clocked'])}; TTFT {c['ms']:.1f} ms, add {c['add_ms']:.2f} ms):"
        lines += ["", head, ""]
        lines += [markdown_table(["step", "wall ms", *[f"{n} ms" for n in names]], table), ""]
        if "profiled" in r:
            p = r["profiled"]
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in list(p["by_kind_ms"].items())[:6])
            lines.append(
                f"profiled: TTFT {p['ms']:.1f} ms, GPU busy {p['busy_ms']:.2f} ms ({p['kernels']} kernels); "
                f"kernel ms by kind: {kinds}"
            )
            top = [[n, calls, round(ms, 3)] for n, calls, ms in p["top"]]
            lines += ["", markdown_table(["kernel", "calls", "ms"], top), ""]
        if "to_end_ms" in r:
            ends = r["to_end_ms"]
            lines.append(
                f"add -> end, free: p50 {statistics.median(ends):.2f} ms over {len(ends)} requests "
                f"(min {min(ends):.2f}, max {max(ends):.2f})"
            )
            lines.append("")
        if "whole" in r:
            w = r["whole"]
            idle = sum(g[1] for g in w["gaps"]) / 1e3  # (each gap: [from ms, µs])
            lines.append(
                f"whole request under the profiler: {w['wall_ms']:.1f} ms, GPU busy {w['busy_ms']:.2f} ms "
                f"({w['kernels']} kernels), {len(w['gaps'])} idle gaps over 30 µs summing {idle:.2f} ms"
            )
            lines.append(f"first kernel {w['first_kernel_ms']} ms after the add began")
            lines += ["", markdown_table(["host span (0 = add)", "from ms", "host ms"], w["steps"]), ""]
            head = ["GPU range of a span's launches: from ms", "ms", "kernels"]
            lines += [markdown_table(head, w["gpu_ranges"]), ""]
            gaps = sorted(w["gaps"], key=lambda g: -g[1])[:20]
            lines += [markdown_table(["idle from (ms after add)", "µs"], gaps), ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="checkpoint or weightless skeleton directory")
    parser.add_argument("--paths", default="s2t,i2t", help="bench paths, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="requests per window")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--whole", action="store_true", help="also one request to its end under the profiler")
    parser.add_argument("--out", required=True)
    add_option_argument(parser, "Omni")
    args = parser.parse_args()
    device = torch.device(args.device)
    base = FULL_OPTIONS if device.type == "cuda" else CPU_OPTIONS
    omni = Omni(model=args.model, **{**base, **dict(args.option)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in args.paths.split(","):
        rows.append(probe(omni, path, args.repeats, device, out if args.whole else None))
        (out / "ttft.json").write_text(json.dumps(rows, indent=1))
        (out / "ttft.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
