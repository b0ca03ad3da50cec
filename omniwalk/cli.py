"""The ``omniwalk`` command line: ``serve``, ``bench``, ``make-tiny``, ``inspect``."""

from __future__ import annotations

import argparse
import contextlib
import signal
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
    what = "a config + tokenizer skeleton" if args.no_weights else f"a random-weight checkpoint (seed {args.seed})"
    print(f"writing {what} from {config} to {args.out_dir}", flush=True)
    out = make_tiny_checkpoint(
        args.out_dir,
        config,
        args.seed,
        dtype=getattr(torch, args.dtype),
        max_shard_bytes=int(args.max_shard_mb * 1024**2),
        with_weights=not args.no_weights,
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


EMBEDDED_DIR = Path.home() / ".cache" / "omniwalk" / "embedded-tiny-v1"


def _embedded_checkpoint() -> Path:
    """The embedded default model: the packaged tiny config with random weights, written once."""
    from omniwalk.models.qwen3_omni.tiny import make_tiny_checkpoint

    if not (EMBEDDED_DIR / "config.json").exists():
        print(f"writing the embedded tiny checkpoint to {EMBEDDED_DIR}", flush=True)
        tmp = EMBEDDED_DIR.with_name(EMBEDDED_DIR.name + ".tmp")
        make_tiny_checkpoint(tmp)
        tmp.rename(EMBEDDED_DIR)
    return EMBEDDED_DIR


def _serve(args: argparse.Namespace) -> None:
    import dataclasses

    import uvicorn

    from omniwalk.config import EngineConfig, ModelConfig, ServerConfig
    from omniwalk.media.limits import MediaLimits
    from omniwalk.serve.app import create_app
    from omniwalk.serve.engine_client import EngineClient
    from omniwalk.tokenizer import Tokenizer

    _QuietServer = _quiet_server_class()  # noqa: N806 - a class
    model = args.model or _embedded_checkpoint()
    if args.model is None:
        print(
            "NOTE: serving the embedded tiny model: its weights are RANDOM, its text and speech are noise", flush=True
        )
    server = ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})
    options = {
        f.name: getattr(args, f.name) for c in (ModelConfig, EngineConfig, MediaLimits) for f in dataclasses.fields(c)
    }
    options["model"] = str(model)
    client = EngineClient(**options)
    print(f"engine process started (pid {client.process.pid}); loading weights from {model}", flush=True)
    url = f"http://{server.host}:{server.port}/v1"
    app = create_app(
        client,
        server,
        Tokenizer.from_dir(model).decode,
        on_ready=lambda: print(f"ready: {url} (model {server.served_model_name!r})", flush=True),
    )
    try:
        _QuietServer(uvicorn.Config(app, host=server.host, port=server.port, log_level="warning")).run()
    finally:
        client.close()  # (idempotent: the lifespan normally did it)
    print("stopped", flush=True)


def _quiet_server_class():
    import uvicorn

    class QuietServer(uvicorn.Server):
        """Ctrl-C / SIGTERM: uvicorn's graceful shutdown, then a normal exit (uvicorn itself
        re-raises the signal afterwards, which prints tracebacks from the lifespan task)."""

        @contextlib.contextmanager
        def capture_signals(self):
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

    return QuietServer


def _bench(args: argparse.Namespace) -> None:
    import asyncio

    from omniwalk.bench.loadgen import BenchConfig, run_cell
    from omniwalk.bench.report import summarize, write
    from omniwalk.bench.workload import PRESETS

    split = lambda text: tuple(x.strip() for x in text.split(",") if x.strip())  # noqa: E731
    cfg = BenchConfig(
        base_url=args.base_url.rstrip("/"),
        model=args.model_name,
        api_key=args.api_key,
        paths=split(args.paths),
        concurrency=tuple(int(b) for b in split(args.concurrency)),
        min_requests=args.min_requests,
        requests_per_concurrency=args.requests_per_concurrency,
        warmup_waves=args.warmup_waves,
    )
    unknown = [p for p in cfg.paths if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown path(s) {unknown}; known: {', '.join(PRESETS)}")
    cells, raw = {}, {}
    for path in cfg.paths:
        for b in cfg.concurrency:
            records, wall = asyncio.run(run_cell(cfg, PRESETS[path], b))
            raw[(path, b)], cells[(path, b)] = records, summarize(records, wall)
            s = cells[(path, b)]
            print(
                f"{path} B={b}: {len(records)} requests in {wall:.1f}s, {s['req_per_s']:.2f} req/s, "
                f"{s['errors']} errors",
                flush=True,
            )
    files = write(args.out, cells, raw)
    print((args.out / "results.md").read_text())
    print("wrote " + ", ".join(str(f) for f in files))


def _flag_type(annotation: str):
    if annotation.startswith("bool"):
        return lambda v: {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}[v.lower()]
    return int if annotation.startswith("int") else float if annotation.startswith("float") else str


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One ``--field-name`` flag per dataclass field, typed and defaulted from the field."""
    import dataclasses

    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = _flag_type(str(f.type))
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=f.default,
            help=f"{cls.__name__}.{f.name} (default: {f.default})",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omniwalk", description="Serve composite any-to-any multimodal models.")
    sub = parser.add_subparsers(dest="command", required=True)

    from omniwalk.config import EngineConfig, ModelConfig, ServerConfig
    from omniwalk.media.limits import MediaLimits

    serve = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API")
    serve.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: embedded tiny model)")
    for cls in (ServerConfig, ModelConfig, EngineConfig, MediaLimits):
        _add_dataclass_flags(serve, cls, skip=("model",))
    serve.set_defaults(func=_serve)

    bench = sub.add_parser("bench", help="closed-loop load test of an OpenAI-compatible omni server")
    bench.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    bench.add_argument("--model-name", default="qwen3-omni", help="the model name the server expects")
    bench.add_argument("--api-key", default=None)
    bench.add_argument("--paths", default="s2t,i2t,s2s,i2s", help="comma list of s2t,i2t,s2s,i2s,t2t,t2s")
    bench.add_argument("--concurrency", default="1,4,16,32", help="comma list of in-flight request counts")
    bench.add_argument("--min-requests", type=int, default=50, help="N = max(min_requests, k * B) per cell")
    bench.add_argument("--requests-per-concurrency", type=int, default=10, help="k in N = max(min_requests, k * B)")
    bench.add_argument("--warmup-waves", type=int, default=1)
    bench.add_argument("--out", type=Path, default=Path("bench-results"))
    bench.set_defaults(func=_bench)

    tiny = sub.add_parser("make-tiny", help="write a random-weight Qwen3-Omni checkpoint directory")
    tiny.add_argument("out_dir", type=Path)
    tiny.add_argument(
        "--config", help="a Qwen3-Omni config.json or a preset (qwen3-omni-30b-a3b); default: the packaged tiny one"
    )
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--dtype", choices=_DTYPES, default="float32")
    tiny.add_argument("--max-shard-mb", type=float, default=2048.0, help="shard the weights above this size")
    tiny.add_argument("--no-weights", action="store_true", help="config + tokenizer only (for --random-weights)")
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
