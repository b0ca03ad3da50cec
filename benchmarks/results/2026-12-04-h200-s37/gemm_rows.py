"""Session 37: the 7B thinker's four projections (bf16, torch.mm = cuBLAS) at prefill row counts.
Prints µs per projection and the 28-layer sum per row count."""

import torch

SHAPES = {"qkv": (3584, 4608), "o": (3584, 3584), "gate_up": (3584, 37888), "down": (18944, 3584)}
ROWS = [98, 112, 118, 128, 144, 160, 192, 216, 256]
dev = torch.device("cuda")
ws = {k: torch.randn(n, kk, device=dev, dtype=torch.bfloat16) * 0.02 for k, (kk, n) in SHAPES.items()}
print("rows | " + " | ".join(SHAPES) + " | 28 layers ms")
for m in ROWS:
    us = {}
    for k, (kk, _) in SHAPES.items():
        x = torch.randn(m, kk, device=dev, dtype=torch.bfloat16)
        w = ws[k]
        for _ in range(3):
            torch.nn.functional.linear(x, w)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                torch.nn.functional.linear(x, w)
        g.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(5):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        us[k] = a.elapsed_time(b) * 1e3 / 100
    print(f"{m} | " + " | ".join(f"{v:.1f}" for v in us.values()) + f" | {28 * sum(us.values()) / 1e3:.2f}")
