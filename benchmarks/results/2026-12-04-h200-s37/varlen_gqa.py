"""Session 37: does this torch's varlen_attn take GQA keys/values (fewer heads) without repeating them?
Its signature; the 7B thinker's prefill shape (28 query heads, 4 kv heads, head 128; one 120-query chunk
after 96 cached keys + an 8-token padding piece) with k/v repeated vs as they are: equal outputs?
and the time of each (graphs of 28 calls, the repeat included)."""

import inspect

import torch
from torch.nn.attention.varlen import varlen_attn

print("varlen_attn", inspect.signature(varlen_attn))
dev, bf16 = "cuda", torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
q = torch.randn(128, 28, 128, generator=g, device=dev).to(bf16)
k = torch.randn(256, 4, 128, generator=g, device=dev).to(bf16)
v = torch.randn(256, 4, 128, generator=g, device=dev).to(bf16)
cu_q = torch.tensor([0, 120, 128], dtype=torch.int32, device=dev)
cu_k = torch.tensor([0, 216, 224], dtype=torch.int32, device=dev)


def repeated():
    return varlen_attn(
        q,
        k.repeat_interleave(7, 1),
        v.repeat_interleave(7, 1),
        cu_q,
        cu_k,
        128,
        256,
        scale=128**-0.5,
        window_size=(-1, 0),
    )


def native():
    return varlen_attn(q, k, v, cu_q, cu_k, 128, 256, scale=128**-0.5, window_size=(-1, 0))


ref = repeated()
try:
    out = native()
    print("GQA-native: equal", torch.equal(out, ref), "max diff", (out.float() - ref.float()).abs().max().item())
except Exception as e:  # noqa: BLE001
    print("GQA-native refused:", type(e).__name__, str(e)[:200])
    native = None
for name, fn in (("repeated", repeated), ("native", native)):
    if fn is None:
        continue
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(28):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    a.record()
    for _ in range(10):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    print(f"{name}: {a.elapsed_time(b) * 1e3 / 280:.1f} us a call")
