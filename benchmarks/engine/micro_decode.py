"""Decode-step micro-benchmarks: B requests held in steady decode, one stage's engine step timed
(thinker: B text requests; talker: B speech requests, one frame each per step) beside its floor."""

from __future__ import annotations

import statistics

from harness import prompt_text
from micro_clock import StageClock, eager_decode, routed_experts, stage_kernels
from roofline import Machine, expected_experts, talker_step, thinker_step

from omniwalk import Omni


def text_request(i: int, max_tokens: int, num_words: int, loras: int = 0) -> dict:
    """Request ``i``; with ``loras`` adapters served, it runs adapter ``a{i % loras}`` (random_adapters.py)."""
    return {
        "messages": [{"role": "user", "content": prompt_text(i, num_words)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    } | ({"lora": f"a{i % loras}"} if loras else {})


def speech_request(i: int, frames: int, num_words: int, loras: int = 0) -> dict:
    """The thinker says 4 tokens and ends; the talker keeps speaking (pad text rows) for ``frames``."""
    return {
        **text_request(i, 4, num_words, loras),
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


def steady_state(omni: Omni, requests: list[dict], is_ready, stage_name: str, decoder, args, device):
    """Run ``requests`` into steady decode, time ``stage_name``'s steps, count the experts its
    ``decoder`` routes to in one more step, abort them -> a row of measured figures."""
    reqs = start(omni, requests, is_ready)
    ms, keys, replays = steady_steps(omni, reqs, stage_name, args, device)
    kernels = stage_kernels(omni.engine, stage_name, device) or {}
    with eager_decode(omni.engine.stages[stage_name].program):
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
        requests = [text_request(i, 4096, args.prompt_words, args.loras) for i in range(b)]
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
    frame_s = cfg.code2wav.samples_per_frame / omni.family.info.sample_rate
    for b in args.talker_batches:
        requests = [speech_request(i, 4096, args.prompt_words, args.loras) for i in range(b)]
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
