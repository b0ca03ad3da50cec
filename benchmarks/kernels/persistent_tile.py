"""A norm's projection tile of the persistent kernel alone, in two forms: what a QKV / GATE_UP tile's work costs.

    PYTHONPATH=. python benchmarks/kernels/persistent_tile.py --out DIR [--reps 64] [--programs 132]

The persistent code-predictor kernel's QKV tile (``persistent_tiles.normed_product``) RMS-norms the residual
rows and multiplies them by 32 columns of the q/k/v weight (1024 inputs) with ``tl.dot`` over 16 rows, the
rows a batch of at most 4 requests fills to 1-8. Its traced work is ~5 us a tile (GATE_UP, two weights, ~7 us)
where its 64 KB come from L2 at 0.14 us a dependent load. This runs such tiles back to back in every program
(one an SM, each its own columns of a [4096, 1024] bf16 weight that stays in L2; a barrier between tiles as
the kernel's signal has), in the kernel's form and in an fp32 multiply-add form over only the rows that exist
(R = 1 or 2: no shared-memory layout conversion for the dot's operands), with one weight (QKV) or two
(GATE_UP), NORM_K inputs at a time. Microseconds a tile from a CUDA graph of one launch; each form's output is
checked against PyTorch. ``TRITON_INTERPRET=1`` on a CPU: the check alone, at small sizes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]  # the repository root, benchmarks/
from harness import graph_call_us, machine, markdown_table, write_report  # noqa: E402

from omniwalk.kernels.persistent_schedule import ROWS  # noqa: E402
from omniwalk.kernels.persistent_tiles import normed_product  # noqa: E402

_ROWS = tl.constexpr(ROWS)


@triton.jit
def _fma_product(
    h_ptr,
    rows,
    eps,
    norm_ptr,
    w_ptr,
    w2_ptr,
    n0,
    N: tl.constexpr,
    HIDDEN: tl.constexpr,
    TWO: tl.constexpr,
    BLOCK_N: tl.constexpr,
    R: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """``normed_product``'s value for rows 0..R-1 (masked past ``rows``) by fp32 multiply-adds: [R, BLOCK_N]."""
    dt = w_ptr.dtype.element_ty
    rr = tl.arange(0, R)
    ok = rr < rows
    kk = tl.arange(0, CHUNK)
    squares = tl.zeros([R], dtype=tl.float32)
    for k0 in tl.static_range(0, HIDDEN, CHUNK):
        x = tl.load(h_ptr + rr[:, None] * HIDDEN + k0 + kk[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        x = x.to(tl.float32)
        squares += tl.sum(x * x, 1)
    rstd = tl.rsqrt(squares / HIDDEN + eps)
    nn = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros([R, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([R, BLOCK_N], dtype=tl.float32)
    for k0 in tl.static_range(0, HIDDEN, CHUNK):
        w_at = nn[:, None] * HIDDEN + k0 + kk[None, :]
        w = tl.load(w_ptr + w_at, mask=(nn < N)[:, None], other=0.0).to(tl.float32)
        x = tl.load(h_ptr + rr[:, None] * HIDDEN + k0 + kk[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        normed = (x.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)
        x = (tl.load(norm_ptr + k0 + kk).to(tl.float32)[None, :] * normed).to(dt).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], 2)
        if TWO:
            w2 = tl.load(w2_ptr + w_at, mask=(nn < N)[:, None], other=0.0).to(tl.float32)
            acc2 += tl.sum(x[:, None, :] * w2[None, :, :], 2)
    return acc, acc2


@triton.jit
def tiles(
    h_ptr,
    norm_ptr,
    w_ptr,
    w2_ptr,
    out_ptr,
    rows,
    eps,
    reps,
    N: tl.constexpr,
    HIDDEN: tl.constexpr,
    TWO: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FMA: tl.constexpr,
    R: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """``reps`` tiles a program, each its own next columns; out [programs, R, BLOCK_N]: the sum of its tiles."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    ACC: tl.constexpr = R if FMA else _ROWS  # (the dot form's rows: all 16, stored up to R at the end)
    rr = tl.arange(0, ACC)
    nn = tl.arange(0, BLOCK_N)
    total = tl.zeros([ACC, BLOCK_N], dtype=tl.float32)
    i = 0
    while i < reps:  # (a while loop: not software-pipelined, as the kernel's tiles are apart)
        n0 = ((pid + i * programs) % (N // BLOCK_N)) * BLOCK_N
        if FMA:
            acc, acc2 = _fma_product(h_ptr, rows, eps, norm_ptr, w_ptr, w2_ptr, n0, N, HIDDEN, TWO, BLOCK_N, R, CHUNK)
        else:
            acc, acc2 = normed_product(
                h_ptr, rr, rr < rows, eps, norm_ptr, w_ptr, w2_ptr, n0, N, HIDDEN, TWO, BLOCK_N, HIDDEN
            )
        total += acc + acc2
        tl.debug_barrier()  # (as the kernel's signal after each tile)
        i += 1
    out = out_ptr + pid * R * BLOCK_N + rr[:, None] * BLOCK_N + nn[None, :]
    tl.store(out, total, mask=(rr < R)[:, None])


def expected(h, norm, w, w2, rows, eps, programs, reps, block_n, two):
    """PyTorch: each program's sum over its tiles of the normed rows times its columns (fp32)."""
    x = h[:rows].float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype).float()
    x = (norm.float() * normed).to(h.dtype).float()
    full = x @ w.float().T + (x @ w2.float().T if two else 0)  # [rows, N]
    out = torch.zeros(programs, rows, block_n, device=h.device)
    blocks = w.shape[0] // block_n
    for p in range(programs):
        for i in range(reps):
            n0 = ((p + i * programs) % blocks) * block_n
            out[p] += full[:, n0 : n0 + block_n]
    return out


def run(form: str, rows: int, two: bool, chunk: int, args, device, dtype, check: bool):
    n, hidden, block_n = args.columns, args.hidden, 32
    gen = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(ROWS, hidden, generator=gen).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype)
    w = (0.05 * torch.randn(n, hidden, generator=gen)).to(device, dtype)
    w2 = (0.05 * torch.randn(n, hidden, generator=gen)).to(device, dtype) if two else w
    r = 1 << (rows - 1).bit_length()
    out = torch.empty(args.programs, r, block_n, device=device, dtype=torch.float32)
    fma = form == "fma"

    def launch(_i=0):
        tiles[(args.programs,)](
            h,
            norm,
            w,
            w2,
            out,
            rows,
            1e-6,
            args.reps,
            N=n,
            HIDDEN=hidden,
            TWO=two,
            BLOCK_N=block_n,
            FMA=fma,
            R=r,
            CHUNK=chunk,
            num_warps=8,
        )

    launch()
    if check:
        want = expected(h, norm, w, w2, rows, 1e-6, args.programs, args.reps, block_n, two)
        torch.testing.assert_close(out[:, :rows], want, rtol=2e-2, atol=2e-2 * args.reps)
    if device.type != "cuda":
        return None
    return graph_call_us(launch, 1) / args.reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=64)
    p.add_argument("--programs", type=int, default=0, help="0: one an SM")
    p.add_argument("--columns", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=1024)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        args.programs = args.programs or torch.cuda.get_device_properties(device).multi_processor_count
        dtype = torch.bfloat16
    else:  # (Triton's interpreter: the check at small sizes)
        args.programs, args.reps, args.columns, args.hidden, dtype = 2, 2, 128, 512, torch.float32
    cells = []
    for two in (False, True):
        for form, rows, chunk in [
            ("dot", 1, 256),
            ("dot", 2, 256),
            ("fma", 1, 256),
            ("fma", 2, 256),
            ("fma", 1, 512),
            ("fma", 2, 128),
        ]:
            us = run(form, rows, two, chunk, args, device, dtype, check=True)
            cells.append(dict(weights=2 if two else 1, form=form, rows=rows, chunk=chunk, us_a_tile=us))
            print(f"weights {2 if two else 1} {form} rows {rows} chunk {chunk}: {us} us a tile", flush=True)
    if device.type != "cuda":
        return
    headers = ["weights", "form", "rows", "NORM_K / CHUNK", "us a tile"]
    rows = [[c["weights"], c["form"], c["rows"], c["chunk"], c["us_a_tile"]] for c in cells]
    info = machine(device)
    md = f"{info['device']}, {args.programs} programs, {args.reps} tiles each\n\n" + markdown_table(headers, rows)
    write_report(args.out, "persistent_tile", dict(machine=info, args=vars(args), cells=cells), md)
    print(md)


if __name__ == "__main__":
    main()
