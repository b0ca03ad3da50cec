"""Benchmark statistics, the markdown table and the charts (metric vs concurrency per path, with the
published anchors of other systems beside ours: the served model's family ships them,
``models/registry.py`` ``bench_anchors``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from omniwalk.bench.loadgen import RequestRecord
from omniwalk.bench.workload import VALIDATOR

CHARTS = (  # (file stem, summary key, axis label)
    ("req_per_s", "req_per_s", "requests / s"),
    ("audio_s_per_s", "audio_s_per_s", "audio seconds / s"),
    ("ttft_text_p50", "ttft_text_p50", "time to first text p50 (s)"),
    ("ttft_audio_p50", "ttft_audio_p50", "time to first audio p50 (s)"),
    ("rtf_p50", "rtf_p50", "real-time factor p50"),
    ("itl_text_mean", "itl_text_mean", "text inter-token latency mean (s)"),
)


def _stats(prefix: str, values: list[float]) -> dict:
    if not values:
        return {}
    v = np.asarray(values)
    q = np.percentile(v, [50, 95, 99])
    return {f"{prefix}_mean": v.mean(), f"{prefix}_p50": q[0], f"{prefix}_p95": q[1], f"{prefix}_p99": q[2]}


def summarize(records: list[RequestRecord], wall: float) -> dict:
    ok = [r for r in records if r.error is None]
    out = {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "req_per_s": len(ok) / wall,
        "tok_per_s": sum(r.completion_tokens for r in ok) / wall,
        "audio_s_per_s": sum(r.audio_seconds for r in ok) / wall,
    }
    out |= _stats("ttft_text", [r.first_text - r.start for r in ok if r.first_text])
    out |= _stats("ttft_audio", [r.first_audio - r.start for r in ok if r.first_audio])
    out |= _stats("itl_text", [g for r in ok for g in np.diff(r.text_times)])
    out |= _stats("itl_audio", [g for r in ok for g in np.diff(r.audio_times)])
    out |= _stats("e2e", [r.e2e for r in ok])
    out |= _stats("rtf", [r.e2e / r.audio_seconds for r in ok if r.audio_seconds])
    checked = [r.valid for r in ok if r.valid is not None]
    if checked:  # (paths with a notion of a valid answer: JSON out)
        out["valid_pct"] = 100 * sum(checked) / len(checked)
    return {k: float(v) if not isinstance(v, int) else v for k, v in out.items()}


VALID_MEANS = {  # what "valid" means, by what checked it (``workload.VALIDATOR``)
    "jsonschema": "parse as JSON and validate against their schema (jsonschema)",
    "json.loads": "parse as JSON (not validated against their schema: jsonschema is not installed)",
}


def markdown(cells: dict[tuple[str, int], dict]) -> str:
    columns = ["path", "B", "req/s", "tok/s", "audio s/s", "TTFT text p50 (s)", "TTFT audio p50 (s)"]
    columns += ["ITL mean (ms)", "E2E p50 (s)", "RTF p50", "valid %", "errors"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for (path, b), s in sorted(cells.items()):
        cols = [
            f"{s['req_per_s']:.2f}",
            f"{s['tok_per_s']:.1f}",
            f"{s['audio_s_per_s']:.2f}",
            _fmt(s, "ttft_text_p50", 3),
            _fmt(s, "ttft_audio_p50", 3),
            _fmt(s, "itl_text_mean", 1, 1000),
            _fmt(s, "e2e_p50", 3),
            _fmt(s, "rtf_p50", 3),
            _fmt(s, "valid_pct", 1),
            str(s["errors"]),
        ]
        lines.append(f"| {path} | {b} | " + " | ".join(cols) + " |")
    if any("valid_pct" in s for s in cells.values()):
        lines.append(f"\nvalid %: finished answers that {VALID_MEANS[VALIDATOR]}.")
    return "\n".join(lines)


def _fmt(s: dict, key: str, digits: int, scale: float = 1.0) -> str:
    return f"{s[key] * scale:.{digits}f}" if key in s else "-"


CHARTS_HINT = "charts skipped: matplotlib is not installed (pip install 'omniwalk[bench]')"


def can_chart() -> bool:
    """Whether matplotlib imports (the ``bench`` extra): charts are optional, tables are not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write(out: Path, cells: dict, raw: dict[tuple[str, int], list[RequestRecord]], anchors: dict | None = None):
    """results.json (summaries + raw per-request records), results.md, and, with matplotlib, a PNG
    per metric with ``anchors`` (system -> path -> concurrency -> summary key -> value) drawn beside ours."""
    out.mkdir(parents=True, exist_ok=True)
    data = {f"{p}@{b}": {"summary": s, "requests": [asdict(r) for r in raw[(p, b)]]} for (p, b), s in cells.items()}
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "results.md").write_text(markdown(cells) + "\n")
    charts = _charts(out, cells, anchors or {}) if can_chart() else []
    return [out / "results.json", out / "results.md", *charts]


def _charts(out: Path, cells: dict, anchors: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files, markers = [], dict(zip(anchors, "x^sDv", strict=False))
    paths = sorted({p for p, _ in cells})
    for stem, key, label in CHARTS:
        drawn = {path: sorted((b, s[key]) for (p, b), s in cells.items() if p == path and key in s) for path in paths}
        drawn = {path: pts for path, pts in drawn.items() if pts and (key != "audio_s_per_s" or any(v for _, v in pts))}
        if not drawn:  # e.g. the audio chart of a text-only run (a log axis over nothing cannot be drawn)
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for path, points in drawn.items():
            (line,) = ax.plot(*zip(*points, strict=True), marker="o", label=path)
            for system, marker in markers.items():  # the published anchors, in the path's colour
                cells_of = anchors[system].get(path, {})
                points = sorted((b, values[key]) for b, values in cells_of.items() if key in values)
                if points:
                    ax.scatter(*zip(*points, strict=True), marker=marker, color=line.get_color(), s=40)
        for system, marker in markers.items():  # legend entries for the anchors' markers
            ax.scatter([], [], marker=marker, color="gray", label=f"{system} (2xH200, real weights)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=100)
        plt.close(fig)
        files.append(out / f"{stem}.png")
    return files
