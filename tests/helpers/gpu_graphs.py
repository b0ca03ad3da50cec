"""A tiny Qwen3-Omni on the GPU (bf16, CUDA graphs up to a batch size) and a mixed text and speech
workload for it."""


def gpu_omni(graphs: int, **options):
    from helpers.qwen3_omni import checkpoint

    from omniwalk import Omni

    return Omni(
        model=checkpoint("tiny"),
        device="cuda",
        dtype="bfloat16",
        cuda_graph_max_batch=graphs,
        thinker_kv_bytes=64 * 2**20,
        talker_kv_bytes=16 * 2**20,
        **options,
    )


def gpu_requests():
    words = "tell me a long story about the sea and the ships and the people".split()
    text = [
        {
            "messages": [{"role": "user", "content": " ".join(words[: 3 + i])}],
            "max_tokens": 24,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 2,
        }
        for i in range(4)
    ]
    for i, r in enumerate(text):
        r.update(temperature=0.0) if i % 2 == 0 else r.update(temperature=0.8, seed=7 + i)
    speech = [
        {
            **r,
            "modalities": ["text", "audio"],
            "min_audio_frames": 33,  # vocoder chunks of 5, 5, 10 and a last 13 (padded to 20)
            "max_audio_frames": 33,
            "talker_temperature": 0.0 if i % 2 == 0 else 0.9,
            "code_predictor_temperature": 0.0 if i % 2 == 0 else 1.0,
            "seed": 100 + i,
        }
        for i, r in enumerate(text)
    ]
    return text + speech  # 8 thinker rows, 4 talker rows: both exact buckets
