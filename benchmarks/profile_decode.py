"""Where a full-size decode step's time goes (one GPU, random bf16 weights).

    python benchmarks/profile_decode.py SKELETON_DIR [BATCH]

Runs a t2t request into steady decode, then profiles 5 engine steps at B=BATCH (default 1) and prints the
top operators by self CPU and by CUDA time, and the wall time per step.
"""

import cProfile
import pstats
import sys
import time

import torch
from smoke_full import build_full  # noqa: E402 - benchmarks/ is on sys.path when run as a script
from torch.profiler import ProfilerActivity, profile


def main(skeleton: str, batch: int = 1) -> None:
    omni = build_full(skeleton)
    for i in range(batch):
        omni.add(
            {
                "messages": [{"role": "user", "content": f"hello {i}"}],
                "max_tokens": 200,
                "ignore_eos": True,
                "temperature": 0.0,
            }
        )
    for _ in range(10):
        omni.engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        omni.engine.step()
    torch.cuda.synchronize()
    print(f"engine step in steady decode, B={batch}: {(time.perf_counter() - start) / 10 * 1e3:.1f} ms")
    program = omni.engine.stages["thinker"].program
    if program.decode_graph is not None:  # the captured forward alone, replayed back to back
        bucket = min(b for b in program.decode_graph.graphs if b >= batch)
        graph = program.decode_graph.graphs[bucket][0]
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"thinker decode graph replay, bucket {bucket}: {begin.elapsed_time(end) / 20:.2f} ms")
        for name, stage in omni.engine.stages.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                stage.step()
                stage.finish()
            torch.cuda.synchronize()
            print(f"  stage {name}.step() + finish(): {(time.perf_counter() - start) / 10 * 1e3:.2f} ms")
    python_profile = cProfile.Profile()  # where the host's time goes, by Python function
    python_profile.enable()
    for _ in range(5):
        omni.engine.step()
    torch.cuda.synchronize()
    python_profile.disable()
    pstats.Stats(python_profile).sort_stats("tottime").print_stats(20)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            omni.engine.step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))
    print(averages.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
