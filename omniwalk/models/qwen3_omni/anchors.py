"""Anchor figures of other systems serving Qwen3-Omni, drawn beside ours in the bench charts of a
server that serves this family under its default name (``models/registry.py`` ``bench_anchors``).

Source: the project's seed benchmark (figures copied here 2026-12-01): M* and vLLM-Omni serving
Qwen3-Omni-30B-A3B with real weights on 2 x H200, closed loop, N = max(50, 10·B), at B = 1 and 32.
Ours run random weights on one H200 with matched work per request, so read them as anchors, not
as a like-for-like race. Units are the summary's: s, req/s, audio s/s (ITL in s).
"""

from __future__ import annotations

# served model name -> system -> path -> concurrency -> summary key -> value
ANCHORS: dict[str, dict[str, dict[str, dict[int, dict[str, float]]]]] = {
    "qwen3-omni": {
        "M*": {
            "s2t": {
                1: {"req_per_s": 4.83, "ttft_text_p50": 0.097, "itl_text_mean": 0.0070},
                32: {"req_per_s": 25.5, "ttft_text_p50": 0.397, "itl_text_mean": 0.0594},
            },
            "i2t": {
                1: {"req_per_s": 0.75, "ttft_text_p50": 0.215, "itl_text_mean": 0.0068},
                32: {"req_per_s": 4.46, "ttft_text_p50": 0.576, "itl_text_mean": 0.0341},
            },
            "s2s": {
                1: {"req_per_s": 2.88, "rtf_p50": 0.121, "ttft_audio_p50": 0.222},
                32: {"req_per_s": 17.6, "rtf_p50": 0.587, "ttft_audio_p50": 1.306},
            },
            "i2s": {
                1: {"audio_s_per_s": 11.7, "rtf_p50": 0.086, "ttft_audio_p50": 0.371},
                32: {"audio_s_per_s": 98.7, "rtf_p50": 0.316, "ttft_audio_p50": 0.952},
            },
        },
        "vLLM-Omni": {
            "s2t": {
                1: {"req_per_s": 2.33, "ttft_text_p50": 0.140, "itl_text_mean": 0.0121},
                32: {"req_per_s": 12.5, "ttft_text_p50": 0.284, "itl_text_mean": 0.0787},
            },
            "i2t": {
                1: {"req_per_s": 0.37, "ttft_text_p50": 0.150, "itl_text_mean": 0.0123},
                32: {"req_per_s": 2.55, "ttft_text_p50": 0.206, "itl_text_mean": 0.0574},
            },
            "s2s": {
                1: {"req_per_s": 0.79, "rtf_p50": 0.192, "ttft_audio_p50": 0.531},
                32: {"req_per_s": 5.1, "rtf_p50": 0.778, "ttft_audio_p50": 2.329},
            },
            "i2s": {
                1: {"audio_s_per_s": 6.4, "rtf_p50": 0.158, "ttft_audio_p50": 0.559},
                32: {"audio_s_per_s": 47.4, "rtf_p50": 0.661, "ttft_audio_p50": 2.502},
            },
        },
    }
}
