"""How near the weight-read floor can one launch walk a chain of dependent GEMV steps? (issue 41's probe)

    PYTHONPATH=. python benchmarks/kernels/chain_probe.py --out DIR [--depths 4,8,12] [--threads 256,512] \
        [--copies cp.async,bulk,ws] [--l2-hints none,evict_first] [--syncs counter,flags] [--trace]

The code predictor's frame, reduced to what bounds it at B = 1: 315 dependent steps over the full-size
shapes (per pass and layer: q/k/v 4096 x 1024, output 1024 x 2048, gate/up 6144 x 1024, down 1024 x 3072;
then a head 2048 x 1024; 15 passes), random bf16 weights, 2.42 GB read a frame. Step s computes
y_s = W_s norm(x_s) in fp32, where x_s is y_{s-1}'s first K_s entries (after gate/up: silu(gate) * up) and
norm divides by the RMS: every step needs the whole output of the one before, as the frame's norms do.

Three ways, same machine, microseconds a frame:

    layered    one cuBLAS GEMV launch a step (``F.linear``, no norm), the 315 launches replayed from a
               CUDA graph: the chain as a kernel a step
    chain      one persistent CUDA kernel (``chain_probe.cu``, built at first use by NVRTC through
               ``torch.cuda``, its settings #defined in front): each block owns fixed rows of every step
               (its shares of the steps held in shared memory) and streams its rows of the coming steps
               into a ring of shared memory, independent of the dependency chain. ``--copies``:
               ``cp.async`` (DEPTH chunks of 8 KiB in flight, 16 bytes a thread), ``bulk`` (one copy a
               chunk by the bulk copy engine, completing on the slot's barrier) or ``ws`` (a producer warp
               alone streams, bulk copies through full / empty barriers; the consumer warps synchronise
               among themselves). A step waits for a counter the blocks count their rows of the step
               before in (a release / acquire pair, one count a block), reads that output from L2,
               computes its rows from shared memory, counts itself in (``--syncs counter``; ``flags``:
               no counter, each output entry stored with the launch's epoch beside it in one 8-byte word,
               so that reading a step's input, spinning until every entry carries the epoch, is its wait:
               by design one L2 round trip a step where the counter takes three; cp.async and bulk). Each step's
               output is checked
               against PyTorch's (fp32, same weights) from the kernel's own output of the step before (over
               315 steps the chain's rounding compounds); the script exits non-zero where they differ
    stream     the same kernel with the waits left out (its results race: not checked): what its weight
               stream alone costs, the bound the waits add to; and its parts alone: the weights streamed
               with no step computed, the steps computed (with and without the waits) with no weights
               streamed

and the floor (the frame's bytes at the measured copy rate). ``--l2-hints evict_first``: the weight stream
asks L2 to evict its lines first (they are read once a pass). ``--trace``: the first cp.async / bulk variant
of each sync once more with thread 0 of each block stamping its clock at each step's phases (weights in, the
wait, the input read and its norm, the rows, the count), with its weights streamed and without: which phase
the stream slows. Writes chain_probe.json/.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import copy_gbs, graph_call_us, int_list, machine, markdown_table, write_report  # noqa: E402

from omniwalk.kernels.cuda_frame import allow_shared_memory  # noqa: E402

HIDDEN, HEADS_WIDTH, QKV, INTERMEDIATE, VOCAB, LAYERS, PASSES = 1024, 2048, 4096, 3072, 2048, 5, 15
CHUNK = 8192  # bytes a block asks for at once (16 a thread at 512 threads)
YMAX = 2 * INTERMEDIATE  # the widest step output
EPS = 1e-6
MAX_STEPS = 512  # steps whose shares a block holds in shared memory
PHASES = ("weights in", "wait", "input and norm", "rows", "count, next")  # (a traced step's, in order)


@dataclass(frozen=True)
class Variant:
    copy: str  # cp.async, bulk or ws
    threads: int
    depth: int  # chunks in flight (cp.async, bulk)
    hint: str = "none"  # the weight stream's L2 policy: none or evict_first (cp.async, bulk)
    sync: str = "counter"  # how a step waits for the one before: counter or flags (cp.async, bulk)

    def __str__(self) -> str:
        return f"{self.copy}, {self.threads} threads, depth {self.depth}, L2 hint {self.hint}, {self.sync}"


KERNELS = Path(__file__).with_suffix(".cu")  # chain_frame and chain_ws, their settings #defined in front


def source(**defines) -> str:
    """The kernels' source with ``defines`` (name: value) in front."""
    return "".join(f"#define {name.upper()} {value}\n" for name, value in defines.items()) + KERNELS.read_text()


def steps() -> list[tuple[str, int, int, int]]:
    """(name, N, K, kind) of the frame's steps: kind 1 reads silu(gate) * up of the step before."""
    layer = [("qkv", QKV, HIDDEN, 0), ("out", HIDDEN, HEADS_WIDTH, 0), ("gate_up", YMAX, HIDDEN, 0)]
    layer.append(("down", HIDDEN, INTERMEDIATE, 1))
    return [s for _ in range(PASSES) for s in layer * LAYERS + [("head", VOCAB, HIDDEN, 0)]]


class Chain:
    """The weights (one arena: each layer's four matrices, then the 15 heads), the step table, the kernel."""

    def __init__(self, seed: int = 0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.steps = steps()
        sizes = {name: n * k for name, n, k, _ in self.steps[: 4 * LAYERS + 1]}
        offsets, at = {}, 0
        for layer in range(LAYERS):
            for name in ("qkv", "out", "gate_up", "down"):
                offsets[(layer, name)] = at
                at += sizes[name]
        for head in range(PASSES):
            offsets[(head, "head")] = at
            at += sizes["head"]
        self.arena = (torch.randn(at, generator=gen, device="cuda") * 0.03).to(torch.bfloat16)
        rows, self.weights = [], []
        for i, (name, n, k, kind) in enumerate(self.steps):
            p, j = divmod(i, 4 * LAYERS + 1)
            key = (p, "head") if name == "head" else (j // 4, name)
            rows.append((offsets[key], n, k, kind))
            self.weights.append(self.arena[offsets[key] : offsets[key] + n * k].view(n, k))
        self.sms = torch.cuda.get_device_properties("cuda").multi_processor_count
        shares = []  # [steps, blocks] of int4: first weight, rows | first row << 16, K | kind << 16, N
        for offset, n, k, kind in rows:
            bounds = [n * b // self.sms for b in range(self.sms + 1)]
            pairs = zip(bounds[:-1], bounds[1:], strict=True)
            shares += [(offset + r0 * k, (r1 - r0) | r0 << 16, k | kind << 16, n) for r0, r1 in pairs]
        self.shares = torch.tensor(shares, dtype=torch.int32, device="cuda")
        self.frame_bytes = sum(w.numel() * 2 for w in self.weights)
        self.ys = torch.zeros(len(self.steps) + 1, YMAX, device="cuda")
        self.ys[0, :HIDDEN] = torch.randn(HIDDEN, generator=gen, device="cuda")
        self.flagged = torch.zeros(len(self.steps) + 1, YMAX, 2, device="cuda")  # (sync flags: entry, epoch)
        self.flagged[0, :, 0] = self.ys[0]
        self.out = self.ys  # the outputs of the kernel built last (flags: the entries of ``flagged``)
        self.counters = torch.zeros(len(self.steps), dtype=torch.int32, device="cuda")
        self.trace = torch.zeros(self.sms, len(self.steps) + 1, 5, dtype=torch.int64, device="cuda")
        self.epoch = 0

    def kernel(self, v: Variant, wait: bool, stream: bool = True, compute: bool = True, trace: bool = False):
        """``v``'s kernel, its launch; ``stream`` / ``compute`` off (timing only): no weights streamed / no
        step's input read nor rows computed; ``trace``: thread 0 of each block stamps its clock at each
        step's phases into ``self.trace`` (cp.async and bulk)."""
        ring, depth, threads = 24, v.depth, v.threads  # (ring: DEPTH chunks in flight beside the widest step's)
        defines = dict(chunk=CHUNK, ring_chunks=ring, depth=depth, threads=threads, consumers=threads // 32)
        flags = v.sync == "flags"
        defines.update(wait=int(wait), flags=int(flags), bulk=int(v.copy == "bulk"), hint=int(v.hint != "none"))
        defines.update(trace=int(trace))
        defines.update(stream=int(stream), compute=int(compute), ymax=YMAX, xmax=INTERMEDIATE, max_steps=MAX_STEPS)
        smem = CHUNK * ring + 4 * INTERMEDIATE + 4 * 32 + 16 * MAX_STEPS + 16 * ring
        self.out = self.flagged[..., 0] if flags else self.ys
        ys = self.flagged if flags else self.ys
        args = [self.arena, self.shares, len(self.steps), ys, self.counters]  # (and the epoch; no floats:
        # torch before 2.12 passes a Python float as a C float, later ones as a double)
        if v.copy == "ws" and flags:
            raise ValueError("the producer-warp kernel waits on counters alone")
        if v.copy == "ws":  # (threads: the consumers'; one producer warp more)
            name, block, tail = "chain_ws", threads + 32, []
        else:
            name, block, tail = "chain_frame", threads, [self.trace]
        code = source(**defines, eps=f"{EPS:e}f")
        fn = torch.cuda._compile_kernel(code, name, nvcc_options=["-std=c++17", "-lineinfo"])
        allow_shared_memory(fn, smem)
        widest = max(-(-(-(-n // self.sms) * k * 2) // CHUNK) for _, n, k, _ in self.steps)  # (chunks)
        if widest > ring - depth:
            raise ValueError(f"a step's rows take {widest} chunks: more than the ring's {ring} less DEPTH {depth}")
        self.counters.zero_()  # (the variants count differently: blocks or rows)
        self.flagged[1:].zero_()  # (epochs restart at 1)
        self.epoch = 0

        def launch():
            self.epoch += 1
            fn(grid=(self.sms, 1, 1), block=(block, 1, 1), args=[*args, self.epoch, *tail], shared_mem=smem)

        return launch

    def phases(self, launch) -> dict[str, list[float]]:
        """One traced launch: per step kind, the mean microseconds of thread 0 of a block in each phase of a
        step (``PHASES``), over blocks and steps."""
        self.trace.zero_()
        launch()
        torch.cuda.synchronize()
        t = self.trace.cpu().double()
        stamps, ends = t[:, :-1], t[:, -1]
        per_ns = (ends[:, 1] - ends[:, 0]) / (ends[:, 3] - ends[:, 2])  # (each block's clock, cycles a ns)
        nxt = torch.cat([stamps[:, 1:, 0], ends[:, 1:2]], dim=1)  # (the next step's start; the kernel's end)
        spans = torch.stack([*(stamps[:, :, i + 1] - stamps[:, :, i] for i in range(4)), nxt - stamps[:, :, 4]], 2)
        us = spans / per_ns[:, None, None] / 1e3
        out = {}
        for kind in dict.fromkeys(name for name, *_ in self.steps):
            mine = [i for i, (name, *_) in enumerate(self.steps) if name == kind]
            out[kind] = [round(x, 2) for x in us[:, mine].mean((0, 1)).tolist()]
        return out

    def errors(self) -> torch.Tensor:
        """Each step's output against PyTorch's, fp32 on the same weights, from the kernel's own output of
        the step before (so that rounding does not compound over the chain): max |difference| / max |y|."""
        out = []
        for s, ((_, n, k, kind), w) in enumerate(zip(self.steps, self.weights, strict=True)):
            y = self.out[s]
            x = F.silu(y[:k]) * y[k : 2 * k] if kind else y[:k]
            expected = w.float() @ (x * torch.rsqrt(x.pow(2).mean() + EPS))
            out.append((self.out[s + 1, :n] - expected).abs().max() / expected.abs().max())
        return torch.stack(out)

    def layered_us(self) -> float:
        """One ``F.linear`` a step (bf16 in and out, no norm), the frame's 315 launches in one graph."""
        x0 = self.ys[0, :HIDDEN].to(torch.bfloat16)[None]

        def frame(_):
            y = x0
            for (_, _, k, _), w in zip(self.steps, self.weights, strict=True):
                y = F.linear(y[:, :k], w)
            return y

        return graph_call_us(frame, 1)


def event_us(fn, launches: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(launches):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / launches


def _cell(chain: Chain, v: Variant) -> dict:
    """One variant: built, its every step checked against PyTorch, timed with and without its waits."""
    t0 = time.perf_counter()
    launch = chain.kernel(v, wait=True)
    built = time.perf_counter() - t0
    chain.out[1:].zero_()
    launch()
    torch.cuda.synchronize()
    errors = chain.errors()
    error = errors.max().item()
    if not error < 1e-4:
        bad = int((errors >= 1e-4).nonzero()[0])
        step = f"step {bad} ({chain.steps[bad][0]}: {errors[bad].item():.3g}; the largest {error:.3g})"
        print(f"{v}: differs from PyTorch at {step}")
    us = event_us(launch)
    stream = event_us(chain.kernel(v, wait=False))
    copy_only = event_us(chain.kernel(v, wait=False, compute=False))
    compute_only = event_us(chain.kernel(v, wait=False, stream=False))
    waits_compute = event_us(chain.kernel(v, wait=True, stream=False))
    print(
        f"{v}: chain {us:.0f} us, stream {stream:.0f} us (weights alone {copy_only:.0f}, steps' work alone "
        f"{compute_only:.0f}, with the waits {waits_compute:.0f}), error {error:.1e}",
        flush=True,
    )
    cell = {"copy": v.copy, "threads": v.threads, "depth": v.depth, "hint": v.hint, "sync": v.sync, "chain_us": us}
    cell.update(stream_us=stream, copy_only_us=copy_only, compute_only_us=compute_only)
    cell.update(waits_compute_us=waits_compute, error=error, build_s=built)
    return cell


def _traced(chain: Chain, v: Variant) -> tuple[dict, str]:
    """``v``'s chain traced with its weights streamed and without: where a step's time goes."""
    runs = {"weights streamed": {}, "no weights": {"stream": False}}
    data, rows = {}, []
    for label, extra in runs.items():
        data[label] = chain.phases(chain.kernel(v, wait=True, trace=True, **extra))
        rows += [[label, kind, *spans] for kind, spans in data[label].items()]
        print(f"traced {v}, {label}: {data[label]}", flush=True)
    headers = ["run", "step", *(f"{phase} (us)" for phase in PHASES)]
    return data, f"One traced frame of {v} (thread 0 of each block, mean over blocks and steps):\n\n" + (
        markdown_table(headers, rows)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--depths", type=int_list, default=[4, 8, 12], help="chunks of 8 KiB in flight per block")
    p.add_argument("--threads", type=int_list, default=[512], help="threads per block")
    p.add_argument("--copies", default="cp.async,bulk,ws", help="how blocks stream weights: cp.async, bulk, ws")
    p.add_argument("--l2-hints", default="none", help="the weight stream's L2 policy: none, evict_first or both")
    p.add_argument("--syncs", default="counter", help="how a step waits: counter, flags (cp.async, bulk) or both")
    p.add_argument("--trace", action="store_true", help="trace the first cp.async / bulk variant of each sync")
    args = p.parse_args()
    args.copies, args.l2_hints, args.syncs = args.copies.split(","), args.l2_hints.split(","), args.syncs.split(",")
    chain = Chain()
    gbs = copy_gbs()
    floor = chain.frame_bytes / (gbs * 1e3)
    data = {"machine": machine("cuda"), "copy_gbs": gbs, "frame_mb": chain.frame_bytes / 1e6, "floor_us": floor}
    print(f"{len(chain.steps)} steps, {chain.frame_bytes / 1e9:.2f} GB a frame, copy {gbs:.0f} GB/s: floor {floor:.0f}")
    with torch.no_grad():
        data["layered_us"] = chain.layered_us()
        print(f"layered (one GEMV launch a step, graph): {data['layered_us']:.0f} us", flush=True)
        rows, data["cells"], failed = [], [], False
        grid = itertools.product(args.copies, args.threads, args.depths, args.l2_hints, args.syncs)
        variants = [Variant(*v) for v in grid if v[0] != "ws" or v[3:] == ("none", "counter")]
        for v in variants:
            cell = _cell(chain, v)
            failed |= not cell["error"] < 1e-4
            data["cells"].append(cell)
            row = [v.copy, v.threads, v.depth, v.hint, v.sync, cell["chain_us"], cell["stream_us"]]
            row += [cell["copy_only_us"], cell["compute_only_us"], cell["waits_compute_us"], floor]
            row.append(data["layered_us"])
            rows.append([*row, f"{cell['error']:.1e}"])
        traced = {v.sync: v for v in reversed(variants) if v.copy != "ws"}  # (the first of each sync)
        data["phases"], phases = {}, []
        for sync, v in traced.items() if args.trace else ():
            data["phases"][sync], table = _traced(chain, v)
            phases.append(table)
    headers = ["copy", "threads", "depth (8 KiB chunks)", "L2 hint", "sync", "chain (us)", "stream, no waits (us)"]
    headers += ["weights alone (us)", "steps' work alone (us)", "steps' work and waits (us)", "floor (us)"]
    headers += ["layered (us)", "max error / max"]
    note = f"{data['machine']['device']}, copy {gbs:.0f} GB/s, {chain.frame_bytes / 1e6:.0f} MB a frame"
    note += f", {len(chain.steps)} steps"
    text = "\n\n".join([note, markdown_table(headers, rows), *phases])
    write_report(args.out, "chain_probe", data, text)
    if failed:
        raise SystemExit("the chain kernel's outputs differ from PyTorch's (above)")


if __name__ == "__main__":
    main()
