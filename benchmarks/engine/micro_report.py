"""micro.md: the micro-benchmarks' results as markdown tables, one per part, then each decode
step's kernel list (CUDA)."""

from __future__ import annotations

from harness import markdown_table

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
        "floor = max(bytes / bandwidth, FLOPs / matmul rate), formulas in `benchmarks/engine/roofline.py`; "
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
