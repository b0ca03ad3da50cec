"""The ``omniwalk`` command line: ``make-tiny`` and ``inspect`` (``serve``/``bench`` come later)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omniwalk.errors import OmniwalkError

_DTYPES = ("float32", "bfloat16", "float16")


def _make_tiny(args: argparse.Namespace) -> None:
    import torch

    from omniwalk.models.qwen3_omni.tiny import TINY_CONFIG, make_tiny_checkpoint

    start = time.perf_counter()
    config = args.config or TINY_CONFIG
    print(f"writing a random-weight checkpoint from {config} to {args.out_dir} (seed {args.seed})", flush=True)
    out = make_tiny_checkpoint(
        args.out_dir,
        config,
        args.seed,
        dtype=getattr(torch, args.dtype),
        max_shard_bytes=int(args.max_shard_mb * 1024**2),
    )
    files = sorted(p.name for p in out.iterdir())
    print(f"done in {time.perf_counter() - start:.1f}s: {', '.join(files)}")


def _inspect(args: argparse.Namespace) -> None:
    from omniwalk.models.qwen3_omni.config import Qwen3OmniConfig
    from omniwalk.models.qwen3_omni.layout import checkpoint_layout, num_parameters

    cfg = Qwen3OmniConfig.from_hf(args.model)
    print(f"thinker:  {cfg.text}")
    print(f"audio:    {cfg.audio}")
    print(f"vision:   {cfg.vision}")
    print(f"talker:   {cfg.talker.text}")
    print(f"code predictor: {cfg.talker.code_predictor}")
    print(f"code2wav: {cfg.code2wav}")
    print(f"voices:   {', '.join(name for name, _ in cfg.talker.speakers)}")
    print(f"tensors:  {len(checkpoint_layout(cfg)):,}   parameters: {num_parameters(cfg):,}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omniwalk", description="Serve composite any-to-any multimodal models.")
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("make-tiny", help="write a random-weight Qwen3-Omni checkpoint directory")
    tiny.add_argument("out_dir", type=Path)
    tiny.add_argument("--config", type=Path, help="a Qwen3-Omni config.json (default: the packaged tiny config)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--dtype", choices=_DTYPES, default="float32")
    tiny.add_argument("--max-shard-mb", type=float, default=2048.0, help="shard the weights above this size")
    tiny.set_defaults(func=_make_tiny)

    inspect = sub.add_parser("inspect", help="print a checkpoint's normalised config and parameter count")
    inspect.add_argument("model", type=Path, help="checkpoint directory or config.json")
    inspect.set_defaults(func=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except OmniwalkError as e:
        print(f"omniwalk: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
