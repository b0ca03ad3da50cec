"""Engine micro-benchmarks, each figure beside its floor (see roofline.py for the formulas).

    python benchmarks/engine/micro.py SKELETON_DIR --out DIR [--option NAME=VALUE ...]
    python benchmarks/engine/micro.py /tmp/tiny --device cpu --out DIR --thinker-batches 1,2 ...

On CUDA the model is ``harness.FULL_OPTIONS`` (full size from a weightless skeleton, random bf16
weights built on the GPU); on the CPU a checkpoint in float32. ``--option`` overrides any ``Omni``
option (``cuda_graph_max_batch=64``, ``max_running=128``, ...). Parts (``--parts``):

    machine   copy bandwidth and matmul throughput, measured first: the floors' denominators
    thinker   decode step vs batch B: B text requests in steady decode, the thinker stage's step
    talker    talker step vs batch B: B speech requests, one frame each per step (+ code predictor)
    vocoder   Code2Wav chunk decode (the vocoder stage's call) vs chunk frames and batch
    encoders  audio encoder on 4 s clips, vision encoder on 640x480 images, vs batch

``--loras N``: N random rank-``--lora-rank`` adapters on the thinker's q/k/v/o (``random_adapters.py``)
are served, request i with adapter i mod N (a batch mixes them); compare with a run without.

Stage steps are timed inside ``Engine.step`` (synchronised before and after the stage), so the
figures are the engine's own. On CUDA ``kernels`` counts the GPU kernels of one stage step (graph
replays kernel by kernel, torch profiler) or one vocoder call. Writes ``micro.json`` and
``micro.md`` after every part.

This file is the command line; the parts live beside it: ``micro_decode.py`` (thinker and talker
steps), ``micro_components.py`` (vocoder and encoders), ``micro_clock.py`` (stage timing, kernel and
expert counts), ``micro_report.py`` (micro.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import FULL_OPTIONS, add_option_argument, int_list, machine, median_ms, write_report  # noqa: E402
from micro_components import bench_encoders, bench_vocoder  # noqa: E402
from micro_decode import bench_talker, bench_thinker  # noqa: E402
from micro_report import report  # noqa: E402
from random_adapters import write_random_adapters  # noqa: E402
from roofline import Machine, measure_machine  # noqa: E402

from omniwalk import Omni  # noqa: E402
from omniwalk.layers.moe import SparseMoE, use_routing  # noqa: E402

CPU_OPTIONS = dict(device="cpu", dtype="float32")
PARTS = ("thinker", "talker", "vocoder", "encoders")


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
    p.add_argument("--vocoder-frames", type=int_list, default=[5, 10, 20, 25])  # (the schedule's chunk widths)
    p.add_argument("--vocoder-warm-frames", type=int, default=100, help="frames a stream decoded before the chunk")
    p.add_argument("--prompt-words", type=int, default=24, help="words of each request's text (sets the context)")
    p.add_argument("--encoder-batches", type=int_list, default=[1, 8, 32])
    p.add_argument("--audio-seconds", type=float, default=4.0)
    p.add_argument("--image-size", type=int_list, default=[640, 480], help="width,height")
    p.add_argument("--loras", type=int, default=0, help="random adapters (q/k/v/o) served; request i runs a{i %% N}")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=10, help="timed steps (calls) per figure")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--copy-mib", type=int, help="copy-bandwidth buffer (default 2048 on CUDA, 256 on CPU)")
    p.add_argument("--matmul-size", type=int, help="square matmul side (default 8192 on CUDA, 1024 on CPU)")
    return p.parse_args()


def measure_floors(args, device: str, dtype: torch.dtype, is_cuda: bool) -> Machine:
    """Copy bandwidth and matmul throughput of this machine: the floors' denominators."""
    copy_bytes = (args.copy_mib or (2048 if is_cuda else 256)) * 2**20
    matmul_size = args.matmul_size or (8192 if is_cuda else 1024)
    m = measure_machine(device, dtype, copy_bytes, matmul_size, lambda fn: median_ms(fn, device, iters=10))
    print(f"copy {m.copy_bytes_per_s / 1e9:.0f} GB/s, matmul {m.matmul_flops_per_s / 1e12:.1f} TFLOP/s ({dtype})")
    if is_cuda:
        torch.cuda.empty_cache()
    return m


def check_routing(omni: Omni) -> None:
    """The MoE layers route as ``moe_routing`` says (``--option moe_routing=balanced``: uniform expert
    draws, the load of a trained router; ``routed_experts`` shows it). The family applies it before its
    CUDA graphs are captured; where it did not, it is applied here when no graph exists yet (CPU)."""
    mc = omni.config.model
    parts = [p for p in omni.family.parts.values() if isinstance(p, torch.nn.Module)]
    moes = [m for part in parts for m in part.modules() if isinstance(m, SparseMoE)]
    if all(m.routing == mc.moe_routing for m in moes):
        return
    if mc.on_cuda and omni.config.engine.cuda_graph_max_batch > 0:
        raise SystemExit(f"moe_routing={mc.moe_routing} was not applied before the CUDA graphs were captured")
    # TODO: remove once every family applies moe_routing itself
    routed = [omni.family.parts[n] for n in ("thinker", "talker") if n in omni.family.parts]
    use_routing(torch.nn.ModuleList(routed), mc.moe_routing, mc.moe_routing_seed)


def main() -> None:
    args = parse_args()
    is_cuda = torch.device(args.device).type == "cuda"
    options = {**(FULL_OPTIONS if is_cuda else CPU_OPTIONS), **dict(args.option)}
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: {PARTS}")
    if args.loras:
        specs = write_random_adapters(Path(args.model), args.out / "adapters", args.loras, args.lora_rank)
        options |= dict(loras=tuple(specs), max_loras=args.loras, max_lora_rank=args.lora_rank)
    device = options["device"]
    dtype = getattr(torch, options["dtype"])
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "option")}
    results = {"machine": machine(device), "options": options, "args": settings}

    m = measure_floors(args, device, dtype, is_cuda)
    results["roofline"] = {"copy_gb_s": m.copy_bytes_per_s / 1e9, "matmul_tflop_s": m.matmul_flops_per_s / 1e12}

    start_s = time.perf_counter()
    omni = Omni(model=args.model, **options)
    print(f"model built in {time.perf_counter() - start_s:.1f} s")
    check_routing(omni)
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
