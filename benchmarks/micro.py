"""Engine micro-benchmarks, each figure beside its floor (see roofline.py for the formulas).

    PYTHONPATH=. python benchmarks/micro.py SKELETON_DIR --out DIR [--option NAME=VALUE ...]
    PYTHONPATH=. python benchmarks/micro.py /tmp/tiny --device cpu --out DIR --thinker-batches 1,2 ...

On CUDA the model is ``smoke_full.FULL_OPTIONS`` (full size from a weightless skeleton, random bf16
weights built on the GPU); on the CPU a checkpoint in float32. ``--option`` overrides any ``Omni``
option (``cuda_graph_max_batch=64``, ``max_running=128``, ...). Parts (``--parts``):

    machine   copy bandwidth and matmul throughput, measured first: the floors' denominators
    thinker   decode step vs batch B: B text requests in steady decode, the thinker stage's step
    talker    talker step vs batch B: B speech requests, one frame each per step (+ code predictor)
    vocoder   Code2Wav chunk decode (the vocoder stage's call) vs chunk frames and batch
    encoders  audio encoder on 4 s clips, vision encoder on 640x480 images, vs batch

Stage steps are timed inside ``Engine.step`` (synchronised before and after the stage), so the
figures are the engine's own. On CUDA ``kernels`` counts the GPU kernels of one stage step (graph
replays kernel by kernel, torch profiler) or one vocoder call. Writes ``micro.json`` and
``micro.md`` after every part.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, when not installed
from harness import (  # noqa: E402
    add_option_argument,
    int_list,
    machine,
    markdown_table,
    median_ms,
    prompt_text,
    synchronize,
    write_report,
)
from roofline import Machine, Work, expected_experts, measure_machine, talker_step, thinker_step  # noqa: E402
from smoke_full import FULL_OPTIONS  # noqa: E402

from omniwalk import Omni  # noqa: E402
from omniwalk.bench.workload import photo_like, speech_like  # noqa: E402
from omniwalk.media.mel import log_mel  # noqa: E402
from omniwalk.media.patches import image_patches, resize_image  # noqa: E402

CPU_OPTIONS = dict(device="cpu", dtype="float32")
OUTPUT_RATE = 24000  # Code2Wav's sample rate
PARTS = ("thinker", "talker", "vocoder", "encoders")
KERNEL_TOP = 25  # kernels listed per stage step, by total time


class StageClock:
    """Inside ``with``: every engine stage's ``step()`` + ``finish()`` (its launch, then its read
    and commit) is timed (synchronised, ms) per engine step."""

    def __init__(self, engine, device):
        self.engine, self.device = engine, device
        self.ms: dict[str, list[float]] = {name: [] for name in engine.stages}

    def __enter__(self) -> StageClock:
        for name, stage in self.engine.stages.items():
            # instance attributes shadow the methods
            stage.step, stage.finish = self._timed(name, stage.step, False), self._timed(name, stage.finish, True)
        return self

    def __exit__(self, *exc) -> None:
        for stage in self.engine.stages.values():
            del stage.step, stage.finish

    def _timed(self, name: str, method, adds: bool):
        def run():
            synchronize(self.device)
            start = time.perf_counter()
            result = method()
            synchronize(self.device)
            ms = (time.perf_counter() - start) * 1e3
            if adds:  # finish(): part of the same engine step as the step() before it
                self.ms[name][-1] += ms
            else:
                self.ms[name].append(ms)
            return result

        return run


def text_request(i: int, max_tokens: int, num_words: int) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt_text(i, num_words)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def speech_request(i: int, frames: int, num_words: int) -> dict:
    """The thinker says 4 tokens and ends; the talker keeps speaking (pad text rows) for ``frames``."""
    return {
        **text_request(i, 4, num_words),
        "modalities": ["text", "audio"],
        "talker_temperature": 0.0,
        "code_predictor_temperature": 0.0,
        "min_audio_frames": frames,
        "max_audio_frames": frames,
    }


def check(reqs) -> None:
    for r in reqs:
        if r.error is not None:
            raise RuntimeError(f"request {r.id} failed: {r.error!r}") from r.error


def start(omni: Omni, requests: list[dict], is_ready, max_steps: int = 2000) -> list:
    """Add ``requests`` and step the engine until ``is_ready(req)`` holds for every one."""
    stage_limit = omni.config.engine.max_running
    if len(requests) > stage_limit:
        raise SystemExit(f"batch {len(requests)} > max_running {stage_limit}: pass --option max_running=N")
    reqs = [omni.add(r) for r in requests]
    for _ in range(max_steps):
        check(reqs)
        if all(is_ready(r) for r in reqs):
            return reqs
        omni.engine.step()
    raise RuntimeError(f"requests not in steady decode after {max_steps} steps")


def steady_steps(omni: Omni, reqs: list, stage_name: str, args, device) -> tuple[float, float, int | None]:
    """Warm up, then time ``args.steps`` engine steps in which ``stage_name`` runs every request
    once -> (median ms of that stage's step, mean keys read per step over all requests, how many
    of the steps replayed a CUDA graph when the stage reports ``graph_replays``)."""
    engine, stage = omni.engine, omni.engine.stages[stage_name]
    for _ in range(args.warmup):
        engine.step()
    replays = stage.stats().get("graph_replays")
    keys, sizes = [], []
    with StageClock(engine, device) as clock:
        for _ in range(args.steps):
            keys.append(sum(stage.tables[r.id].num_cached + 1 for r in reqs))
            engine.step()
            sizes.append(stage.last_batch_size)
    check(reqs)
    if set(sizes) != {len(reqs)}:
        raise RuntimeError(f"{stage_name} batch sizes {sizes} while timing {len(reqs)} requests")
    if replays is not None:
        replays = stage.stats()["graph_replays"] - replays
    return statistics.median(clock.ms[stage_name]), statistics.mean(keys), replays


def _is_kernel(event) -> bool:
    # (the profiler also puts record_function ranges on the GPU timeline: "micro:stage" is one)
    return event.device_type == DeviceType.CUDA and not event.name.startswith(("Memcpy", "Memset", "micro:"))


def count_kernels(fn, device) -> int | None:
    """GPU kernels ``fn()`` runs (a graph replay's kernels each count), None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for e in prof.events() if _is_kernel(e))


def stage_kernels(engine, stage_name: str, device) -> dict | None:
    """GPU kernels of ``stage_name`` in one engine step: those starting inside its step() or
    finish(), each synchronised on both sides by the StageClock -> {count, busy_us (kernel time
    summed), span_us (first kernel start to last kernel end: the rest are gaps), top (the kernels
    by total time, grouped by name)}; None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    stage = engine.stages[stage_name]

    def ranged(method):
        def run():
            with record_function("micro:stage"):
                return method()

        return run

    with StageClock(engine, device):
        stage.step, stage.finish = ranged(stage.step), ranged(stage.finish)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step()
    events = prof.events()
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "micro:stage"]
    kernels = [e for e in events if _is_kernel(e) and any(a <= e.time_range.start <= b for a, b in spans)]
    if not kernels:
        return dict(count=0, busy_us=0.0, span_us=0.0, top=[])
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:KERNEL_TOP]
    return dict(
        count=len(kernels),
        busy_us=sum(e.time_range.end - e.time_range.start for e in kernels),
        span_us=max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels),
        top=[dict(name=n, calls=len(t), total_us=round(sum(t), 1), mean_us=round(sum(t) / len(t), 2)) for n, t in top],
    )


def routed_experts(decoder, run) -> float | None:
    """Mean distinct experts per MoE layer over the eager forwards in ``run()`` (None if no router
    ran eagerly, e.g. a replayed CUDA graph)."""
    counts = []

    def counter(top_k: int, num_experts: int):
        def hook(module, inputs, logits):  # logits [tokens, experts (+ a folded shared expert's gate)]
            logits = logits[:, :num_experts]
            ids = logits.topk(top_k, dim=-1).indices.flatten()
            hit = torch.zeros(num_experts, dtype=torch.bool, device=logits.device).index_fill_(0, ids, True)
            counts.append(hit.sum())

        return hook

    moes = [layer.mlp for layer in decoder.layers if hasattr(layer.mlp, "gate")]
    handles = [moe.gate.register_forward_hook(counter(moe.top_k, moe.num_experts)) for moe in moes]
    try:
        with torch.inference_mode():
            run()
    finally:
        for h in handles:
            h.remove()
    return float(torch.stack(counts).float().mean()) if counts else None


def steady_state(omni: Omni, requests: list[dict], is_ready, stage_name: str, decoder, args, device):
    """Run ``requests`` into steady decode, time ``stage_name``'s steps, count the experts its
    ``decoder`` routes to in one more step, abort them -> a row of measured figures."""
    reqs = start(omni, requests, is_ready)
    ms, keys, replays = steady_steps(omni, reqs, stage_name, args, device)
    kernels = stage_kernels(omni.engine, stage_name, device) or {}
    routed = routed_experts(decoder, omni.engine.step)
    for r in reqs:
        omni.abort(r.id)
    b = len(requests)
    return dict(
        batch=b,
        ms=ms,
        kernels=kernels.get("count"),
        kernel_busy_ms=kernels["busy_us"] / 1e3 if kernels else None,
        kernel_span_ms=kernels["span_us"] / 1e3 if kernels else None,
        kernel_top=kernels.get("top"),
        graph_steps=replays,
        context=keys / b,
        routed_experts=routed,
    )


def bench_thinker(omni: Omni, args, m: Machine, device, dtype_bytes: int) -> list[dict]:
    cfg, rows = omni.family.cfg.text, []
    for b in args.thinker_batches:
        requests = [text_request(i, 4096, args.prompt_words) for i in range(b)]
        is_ready = lambda r: r.state.thinker.num_generated >= 1  # prefill done
        row = steady_state(omni, requests, is_ready, "thinker", omni.family.parts["thinker"].model, args, device)
        work = thinker_step(cfg, b, round(row["context"] * b), dtype_bytes, row["routed_experts"])
        ms, floor = row["ms"], work.floor_ms(m)
        row |= dict(tok_s=b / ms * 1e3, expected_experts=expected_experts(cfg.num_experts, cfg.num_experts_per_tok, b))
        rows.append(row | dict(floor_gb=work.bytes / 1e9, floor_ms=floor, ratio=ms / floor))
        print(
            f"thinker B={b:3d}: {ms:8.2f} ms/step {b / ms * 1e3:8.1f} tok/s  floor {floor:6.2f} ms x{ms / floor:.1f}  "
            f"kernels {row['kernels']} busy {row['kernel_busy_ms']} ms span {row['kernel_span_ms']} ms"
        )
    return rows


def bench_talker(omni: Omni, args, m: Machine, device, dtype_bytes: int) -> list[dict]:
    cfg, rows = omni.family.cfg, []
    frame_s = cfg.code2wav.samples_per_frame / OUTPUT_RATE
    for b in args.talker_batches:
        requests = [speech_request(i, 4096, args.prompt_words) for i in range(b)]
        is_ready = lambda r: len(r.state.talker.frames) >= 1  # talker prefix done
        row = steady_state(omni, requests, is_ready, "talker", omni.family.parts["talker"].model, args, device)
        work = talker_step(cfg.talker, b, round(row["context"] * b), dtype_bytes, row["routed_experts"])
        ms, floor = row["ms"], work.floor_ms(m)
        rtf = ms / (frame_s * 1e3)  # the talker alone: step time per frame of audio
        row |= dict(frames_s=b / ms * 1e3, audio_s_per_s=b / rtf, rtf=rtf)
        rows.append(row | dict(floor_gb=work.bytes / 1e9, floor_ms=floor, ratio=ms / floor))
        print(
            f"talker  B={b:3d}: {ms:8.2f} ms/step (RTF {rtf:.3f})  floor {floor:6.2f} ms  x{ms / floor:.1f}  "
            f"kernels {row['kernels']} busy {row['kernel_busy_ms']} ms span {row['kernel_span_ms']} ms"
        )
    return rows


def count_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def component_row(module, fn, args, m: Machine, device, eager=None, **fields) -> dict:
    """Time ``fn`` (a call of ``module``) and put it beside its floor: weights read once, FLOPs
    counted on ``eager`` (the same call without graph replay; default ``fn``)."""
    ms = median_ms(fn, device, warmup=args.warmup, iters=args.steps)
    work = Work(weight_bytes(module), count_flops(eager or fn))
    floor = work.floor_ms(m)
    return dict(**fields, ms=ms, gflop=work.flops / 1e9, floor_ms=floor, ratio=ms / floor)


def vocoder_chunk(program, batch: int, frames: int, warm_frames: int, device):
    """Two closures decoding the next ``frames`` of ``batch`` streams the way the vocoder stage
    does (its pool rows gathered, decoded, scattered back): as the stage runs it (graph replay
    where one was captured) and always eagerly. With ``warm_frames`` the streams had decoded that
    many frames and go on; with 0 every call is a first chunk of fresh streams."""
    cfg = program.vocoder.cfg
    gen = torch.Generator().manual_seed(0)

    def codes(t: int) -> torch.Tensor:
        return torch.randint(0, cfg.codebook_size, (batch, t, cfg.num_quantizers), generator=gen).to(device)

    slots, chunk, fresh = torch.arange(batch, device=device), codes(frames), not warm_frames
    if warm_frames:
        program._decode(codes(warm_frames), slots, fresh=True)
    graph = program.graphs.get((frames, fresh))

    def eager():
        return program._decode(chunk, slots, fresh)["wav"]

    def staged():
        return graph.run(batch, {"codes": chunk, "slots": slots})["wav"] if graph and graph.fits(batch) else eager()

    return staged, eager


@torch.inference_mode()
def bench_vocoder(omni: Omni, args, m: Machine, device) -> list[dict]:
    program, rows = omni.engine.stages["vocoder"].program, []
    vocoder, first = program.vocoder, omni.config.family.vocoder_first_chunk_frames
    for frames in args.vocoder_frames:
        for b in args.vocoder_batches:
            for warm in (0, args.vocoder_warm_frames) if frames == first else (args.vocoder_warm_frames,):
                run, eager = vocoder_chunk(program, b, frames, warm, device)
                replays = sum(g.num_replays for g in program.graphs.values())
                row = component_row(vocoder, run, args, m, device, eager, frames=frames, batch=b, start=warm)
                row["graph_calls"] = sum(g.num_replays for g in program.graphs.values()) - replays
                row["kernels"] = count_kernels(run, device)
                row["audio_s_per_s"] = b * frames * vocoder.cfg.samples_per_frame / OUTPUT_RATE / row["ms"] * 1e3
                rows.append(row)
                print(
                    f"vocoder {frames:3d} frames B={b:3d} from frame {warm:3d}: {row['ms']:8.2f} ms "
                    f"{row['audio_s_per_s']:8.1f} audio s/s  floor {row['floor_ms']:.2f} ms  "
                    f"graph calls {row['graph_calls']}  kernels {row['kernels']}"
                )
    return rows


def encoder_row(stage, module, inputs, args, m: Machine, device, **fields) -> dict:
    """One encoder stage call (graph replay where the layout fits a bucket) beside its floor; FLOPs
    counted on the eager module call; ``graph_calls`` = timed calls that replayed a graph."""
    program = stage.program
    replays = program.stats()["graph_replays"]
    row = component_row(module, lambda: program.encode(*inputs), args, m, device, lambda: module(*inputs), **fields)
    row["graph_calls"] = program.stats()["graph_replays"] - replays
    return row


@torch.inference_mode()
def bench_encoders(omni: Omni, args, m: Machine, device, dtype) -> list[dict]:
    audio, vision, rows = omni.family.parts["audio_encoder"], omni.family.parts["vision_encoder"], []
    stages = omni.engine.stages
    for b in args.encoder_batches:
        waves = [torch.from_numpy(speech_like(args.audio_seconds, seed=i)).to(device) for i in range(b)]
        features, num_frames = log_mel(waves)
        inputs = features.to(dtype), num_frames.tolist()
        row = encoder_row(stages["audio_encoder"], audio, inputs, args, m, device, item="audio", batch=b)
        row["log_mel_ms"] = median_ms(lambda: log_mel(waves), device, warmup=args.warmup, iters=args.steps)
        row["per_s"] = b * args.audio_seconds / row["ms"] * 1e3  # audio seconds per second
        rows.append(row)
        print(
            f"audio encoder  B={b:3d} x {args.audio_seconds:g} s: {row['ms']:8.2f} ms floor {row['floor_ms']:.2f} ms "
            f"graph calls {row['graph_calls']}"
        )
    image = torch.from_numpy(resize_image(photo_like(*args.image_size, seed=0)))
    patches, grid = image_patches(image.to(device))
    for b in args.encoder_batches:
        inputs = patches.repeat(b, 1).to(dtype), [grid] * b
        row = encoder_row(stages["vision_encoder"], vision, inputs, args, m, device, item="image", batch=b)
        row["per_s"] = b / row["ms"] * 1e3  # images per second
        rows.append(row)
        print(
            f"vision encoder B={b:3d} x {len(patches)} patches: {row['ms']:8.2f} ms  floor {row['floor_ms']:.2f} ms "
            f"graph calls {row['graph_calls']}"
        )
    return rows


TABLES = {  # part -> (title, columns)
    "thinker": (
        "Thinker decode step",
        ["batch", "ms", "kernels", "tok_s", "graph_steps", "context", "routed_experts", "expected_experts", "floor_gb"]
        + ["floor_ms", "ratio"],
    ),
    "talker": (
        "Talker step (one frame per request, with the code predictor; rtf = ms per 80 ms frame)",
        ["batch", "ms", "kernels", "frames_s", "audio_s_per_s", "rtf", "graph_steps", "context", "routed_experts"]
        + ["floor_gb", "floor_ms", "ratio"],
    ),
    "vocoder": (
        "Vocoder chunk (start = frames each stream decoded before; 0 = a first chunk)",
        ["frames", "batch", "start", "ms", "kernels", "audio_s_per_s", "graph_calls", "gflop", "floor_ms", "ratio"],
    ),
    "encoders": (
        "Encoders (per_s = audio seconds or images per second)",
        ["item", "batch", "ms", "per_s", "graph_calls", "gflop", "floor_ms", "ratio", "log_mel_ms"],
    ),
}


def report(results: dict) -> str:
    m, r = results["machine"], results["roofline"]
    lines = [
        "# Engine micro-benchmarks",
        "",
        f"{m['device']}, torch {m['torch']}, commit {m['commit']}; options {results['options']}",
        "",
        f"Copy bandwidth {r['copy_gb_s']:.0f} GB/s (read + write), matmul {r['matmul_tflop_s']:.1f} TFLOP/s; "
        "floor = max(bytes / bandwidth, FLOPs / matmul rate), formulas in `benchmarks/roofline.py`; "
        "ratio = ms / floor; context = keys read per request; graph_steps = timed steps that replayed a CUDA graph.",
    ]
    for part, (title, columns) in TABLES.items():
        if results.get(part):
            rows = [[row.get(c) for c in columns] for row in results[part]]
            lines += ["", f"## {title}", "", markdown_table(columns, rows)]
    for part in ("thinker", "talker"):
        for row in results.get(part) or []:
            if row.get("kernel_top"):
                lines += [
                    "",
                    f"### {part} B={row['batch']}: {row['kernels']} kernels, {row['kernel_busy_ms']:.2f} ms busy "
                    f"in a {row['kernel_span_ms']:.2f} ms span (step {row['ms']:.2f} ms)",
                    "",
                    markdown_table(
                        ["name", "calls", "total_us", "mean_us"], [list(k.values()) for k in row["kernel_top"]]
                    ),
                ]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="checkpoint or weightless skeleton directory")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="picks the defaults")
    add_option_argument(p, "Omni")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--thinker-batches", type=int_list, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--talker-batches", type=int_list, default=[1, 4, 16, 32])
    p.add_argument("--vocoder-batches", type=int_list, default=[1, 8])
    p.add_argument("--vocoder-frames", type=int_list, default=[5, 25])
    p.add_argument("--vocoder-warm-frames", type=int, default=100, help="frames a stream decoded before the chunk")
    p.add_argument("--prompt-words", type=int, default=24, help="words of each request's text (sets the context)")
    p.add_argument("--encoder-batches", type=int_list, default=[1, 8, 32])
    p.add_argument("--audio-seconds", type=float, default=4.0)
    p.add_argument("--image-size", type=int_list, default=[640, 480], help="width,height")
    p.add_argument("--steps", type=int, default=10, help="timed steps (calls) per figure")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--copy-mib", type=int, help="copy-bandwidth buffer (default 2048 on CUDA, 256 on CPU)")
    p.add_argument("--matmul-size", type=int, help="square matmul side (default 8192 on CUDA, 1024 on CPU)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    is_cuda = torch.device(args.device).type == "cuda"
    options = {**(FULL_OPTIONS if is_cuda else CPU_OPTIONS), **dict(args.option)}
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: {PARTS}")
    device = options["device"]
    dtype = getattr(torch, options["dtype"])
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "option")}
    results = {"machine": machine(device), "options": options, "args": settings}

    copy_bytes = (args.copy_mib or (2048 if is_cuda else 256)) * 2**20
    matmul_size = args.matmul_size or (8192 if is_cuda else 1024)
    m = measure_machine(device, dtype, copy_bytes, matmul_size, lambda fn: median_ms(fn, device, iters=10))
    results["roofline"] = {"copy_gb_s": m.copy_bytes_per_s / 1e9, "matmul_tflop_s": m.matmul_flops_per_s / 1e12}
    print(f"copy {m.copy_bytes_per_s / 1e9:.0f} GB/s, matmul {m.matmul_flops_per_s / 1e12:.1f} TFLOP/s ({dtype})")
    if is_cuda:
        torch.cuda.empty_cache()

    start_s = time.perf_counter()
    omni = Omni(model=args.model, **options)
    print(f"model built in {time.perf_counter() - start_s:.1f} s")
    dtype_bytes = torch.finfo(dtype).bits // 8
    benches = {
        "thinker": lambda: bench_thinker(omni, args, m, device, dtype_bytes),
        "talker": lambda: bench_talker(omni, args, m, device, dtype_bytes),
        "vocoder": lambda: bench_vocoder(omni, args, m, device),
        "encoders": lambda: bench_encoders(omni, args, m, device, dtype),
    }
    results["config"] = {part: asdict(getattr(omni.config, part)) for part in ("model", "engine", "family")}
    results["weights"] = omni.family.info.weights  # (quantisation, GiB per component)
    print(f"weights: {results['weights']}")
    for part in parts:
        print(f"-- {part}")
        results[part] = benches[part]()
        results["engine_stats"] = omni.engine.stats()  # e.g. CUDA graph replays, when a program reports them
        if is_cuda:
            results["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        write_report(args.out, "micro", results, report(results))
    print(report(results))


if __name__ == "__main__":
    main()
