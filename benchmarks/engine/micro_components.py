"""Component micro-benchmarks: one call of the vocoder (a Code2Wav chunk) or an encoder (audio
clips, images), timed as its stage runs it (graph replay where one was captured) beside its floor."""

from __future__ import annotations

import torch
from harness import median_ms
from micro_clock import count_kernels
from roofline import Machine, Work
from torch.utils.flop_counter import FlopCounterMode

from omniwalk import Omni
from omniwalk.bench.workload import photo_like, speech_like
from omniwalk.media.mel import log_mel
from omniwalk.media.patches import image_patches, resize_image


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
    sample_rate = omni.family.info.sample_rate
    for frames in args.vocoder_frames:
        for b in args.vocoder_batches:
            for warm in (0, args.vocoder_warm_frames) if frames == first else (args.vocoder_warm_frames,):
                run, eager = vocoder_chunk(program, b, frames, warm, device)
                replays = sum(g.num_replays for g in program.graphs.values())
                row = component_row(vocoder, run, args, m, device, eager, frames=frames, batch=b, start=warm)
                row["graph_calls"] = sum(g.num_replays for g in program.graphs.values()) - replays
                row["kernels"] = count_kernels(run, device)
                row["audio_s_per_s"] = b * frames * vocoder.cfg.samples_per_frame / sample_rate / row["ms"] * 1e3
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
