"""The ``omniwalk`` command line: ``serve``, ``bench``, ``make-tiny``, ``inspect``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omniwalk.errors import ConfigError, OmniwalkError

_DTYPES = ("float32", "bfloat16", "float16")


def _make_tiny(args: argparse.Namespace) -> None:
    import torch

    from omniwalk.models import registry

    start = time.perf_counter()
    family = (registry.family_for_config(args.config) if args.config else registry.default_family()).Family
    what = "a config + tokenizer skeleton" if args.no_weights else f"a random-weight checkpoint (seed {args.seed})"
    print(f"writing {what} from {args.config or 'the tiny config'} to {args.out_dir}", flush=True)
    out = family.make_tiny(
        args.out_dir,
        args.config,
        args.seed,
        dtype=getattr(torch, args.dtype),
        max_shard_bytes=int(args.max_shard_mb * 1024**2),
        with_weights=not args.no_weights,
        **({"quantization": args.quantization} if args.quantization != "none" else {}),  # (families without FP8)
    )
    files = sorted(p.name for p in out.iterdir())
    print(f"done in {time.perf_counter() - start:.1f}s: {', '.join(files)}")


def _inspect(args: argparse.Namespace) -> None:
    from omniwalk.models.registry import family_class

    print(family_class(args.model).describe(args.model))


def _embedded_checkpoint() -> Path:
    """The embedded default model: the default family's tiny config with random weights, written once."""
    from omniwalk.models.locate import CACHE, written_once
    from omniwalk.models.registry import default_family

    return written_once(CACHE / "embedded-tiny-v2", default_family().Family.make_tiny, "the embedded tiny checkpoint")


def _listening_socket(host: str, port: int):
    """Bind the server's socket first: a port in use is reported before the model loads."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


API_KEY_ENV = "OMNIWALK_API_KEY"  # (a secret, not a knob: the environment keeps it out of ``ps``)


def _api_key(server) -> str | None:
    """The key from one of ``--api-key``, ``--api-key-file`` (its first line) or $OMNIWALK_API_KEY."""
    import os

    given = {"--api-key": server.api_key, API_KEY_ENV: os.environ.get(API_KEY_ENV) or None}
    if server.api_key_file:
        try:
            lines = Path(server.api_key_file).read_text().splitlines()
        except OSError as e:
            raise ConfigError(f"cannot read the API key file {server.api_key_file}: {e.strerror}") from None
        given["--api-key-file"] = (lines[0].strip() if lines else "") or None
        if given["--api-key-file"] is None:
            raise ConfigError(f"the API key file {server.api_key_file} is empty")
    named = [name for name, key in given.items() if key]
    if len(named) > 1:
        raise ConfigError(f"the API key is given more than once ({', '.join(named)}): give one")
    return given[named[0]] if named else None


def serve_configs(args: argparse.Namespace) -> tuple:
    """``serve``'s flags as (ServerConfig, MediaLimits, engine options, checkpoint path or None for the
    embedded tiny model), checked before anything starts (``omniwalk serve`` and the Ray application)."""
    import dataclasses

    from omniwalk.config import EngineConfig, ModelConfig, OmniConfig, ServerConfig
    from omniwalk.media.limits import MediaLimits
    from omniwalk.models import registry
    from omniwalk.models.locate import locate

    server = ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})
    server = dataclasses.replace(server, api_key=_api_key(server))
    model = locate(args.model, args.random_weights, args.hf_cache) if args.model else None
    family = registry.family_module(model) if model else registry.default_family()
    family_options = getattr(family, "Options", None)
    sections = (ModelConfig, EngineConfig, MediaLimits, *filter(None, [family_options]))
    options = {f.name: getattr(args, f.name) for c in sections for f in dataclasses.fields(c)}
    if server.lora_root and not options["max_loras"]:  # adapters loaded at run time need slots
        from omniwalk.config import DEFAULT_MAX_LORAS

        options["max_loras"] = DEFAULT_MAX_LORAS
    OmniConfig.from_kwargs(family_options, **{**options, "model": str(model)})  # errors before anything starts
    limits = MediaLimits(**{f.name: options[f.name] for f in dataclasses.fields(MediaLimits)})
    return server, limits, options, model


def checkpoint_or_embedded(model):
    """``model``, or the embedded tiny checkpoint (written once) when none is given."""
    if model is None:
        model = _embedded_checkpoint()
        print(
            "NOTE: serving the embedded tiny model: its weights are RANDOM, its text and speech are noise", flush=True
        )
    return model


def _serve(args: argparse.Namespace) -> int:
    import logging

    server, limits, options, model = serve_configs(args)
    if args.ray:  # (Ray's HTTP proxy listens: no socket here)
        from omniwalk.serve.ray.launch import serve_on_ray

        return serve_on_ray(args, server, limits, options, model)
    sock = _listening_socket(server.host, server.port)
    logging.basicConfig(level=server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = checkpoint_or_embedded(model)
    options["model"] = str(model)
    return _run_server(server, limits, options, model, sock)


def _run_server(server, limits, options: dict, model, sock) -> int:
    import uvicorn

    from omniwalk.serve.app import create_app
    from omniwalk.serve.guard import header_deadline
    from omniwalk.serve.replicas import Replicas
    from omniwalk.serve.supervisor import Server, Supervisor

    client = Replicas(options, server.data_parallel, server.routing)
    started = "engine process started (pid" if len(client.pids) == 1 else "engine processes started (pids"
    print(f"{started} {', '.join(map(str, client.pids))}); loading weights from {model}", flush=True)
    url = f"http://{server.host}:{server.port}/v1"
    supervisor = Supervisor(client, server.shutdown_grace_s, url, server.served_model_name)
    app = create_app(client, server, limits, supervisor)
    config = uvicorn.Config(
        app,
        log_level=server.log_level,
        access_log=False,  # (omniwalk.access logs every response with its request id)
        http=header_deadline(server.header_timeout_s, app.metrics),
        limit_concurrency=server.max_connections,  # (beyond it uvicorn answers 503)
        timeout_graceful_shutdown=server.shutdown_grace_s + 5,  # (a backstop: the supervisor fails them first)
    )
    try:
        Server(config, supervisor).run(sockets=[sock])
    finally:
        client.close()  # (idempotent: the lifespan normally did it)
        sock.close()
    print("stopped" if supervisor.exit_code == 0 else f"stopped: {supervisor.reason}", flush=True)
    return supervisor.exit_code


def _bench(args: argparse.Namespace) -> None:
    import asyncio

    from omniwalk.bench.loadgen import BenchConfig, run_cell
    from omniwalk.bench.report import CHARTS_HINT, can_chart, summarize, write
    from omniwalk.bench.workload import presets_for
    from omniwalk.models.registry import bench_anchors

    split = lambda text: tuple(x.strip() for x in text.split(",") if x.strip())  # noqa: E731
    base_url, model = args.base_url.rstrip("/"), args.model_name
    if model is None:
        import httpx

        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(f"{base_url}/models", headers=headers, timeout=30).json()["data"][0]["id"]
    cfg = BenchConfig(
        base_url=base_url,
        model=model,
        api_key=args.api_key,
        paths=split(args.paths),
        concurrency=tuple(int(b) for b in split(args.concurrency)),
        min_requests=args.min_requests,
        requests_per_concurrency=args.requests_per_concurrency,
        warmup_waves=args.warmup_waves,
    )
    presets = presets_for(model)  # (speech out in the served model's codec frames)
    unknown = [p for p in cfg.paths if p not in presets]
    if unknown:
        raise SystemExit(f"unknown path(s) {unknown}; known: {', '.join(presets)}")
    cells, raw = {}, {}
    for path in cfg.paths:
        for b in cfg.concurrency:
            records, wall = asyncio.run(run_cell(cfg, presets[path], b, progress=_to_stderr))
            raw[(path, b)], cells[(path, b)] = records, summarize(records, wall)
            s = cells[(path, b)]
            print(
                f"{path} B={b}: {len(records)} requests in {wall:.1f}s, {s['req_per_s']:.2f} req/s, "
                f"{s['errors']} errors",
                flush=True,
            )
    files = write(args.out, cells, raw, bench_anchors(model))
    print((args.out / "results.md").read_text())
    print("wrote " + ", ".join(str(f) for f in files))
    if not can_chart():
        print(CHARTS_HINT, file=sys.stderr)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30}
_SIZE_UNITS["ti"] = 2**40


def parse_size(text: str) -> int:
    """'16GiB', '512MiB', '1.5GB', '1024' -> bytes."""
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 512MiB, 16GiB, 1.5GB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2) or ""])


def format_size(num_bytes: int) -> str:
    """67108864 -> '64MiB': the largest binary unit that divides it exactly (a size ``parse_size`` reads)."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        scale = _SIZE_UNITS[unit.lower()]
        if num_bytes and num_bytes % scale == 0:
            return f"{num_bytes // scale}{unit}B"
    return str(num_bytes)


def parse_bool(text: str) -> bool:
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true / false)")
    return value


class _AppendToTuple(argparse.Action):
    """A repeatable flag whose values make a tuple (the default, an empty tuple, is never changed in place)."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, (*getattr(namespace, self.dest), value))


def _choices() -> dict[str, tuple[str, ...]]:
    from omniwalk.config import DTYPES, LOG_LEVELS, QUANTIZATIONS, backend_choices

    return {"dtype": DTYPES, "log_level": LOG_LEVELS, "quantization": QUANTIZATIONS, **backend_choices()}


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One ``--field-name`` flag per dataclass field, typed and defaulted from the field: booleans
    are flags (``--x``; ``--x false`` also works), ``*_bytes`` take sizes (``512KiB``, ``16GiB``, ``1.5GB``),
    choices are listed."""
    import dataclasses

    choices = _choices()
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))  # (annotations or types)
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        common = {"dest": f.name, "default": default, "help": f"{cls.__name__}.{f.name} (default: {default})"}
        if kind.startswith("tuple"):  # repeatable: each use adds an entry (the flag may be named in the metadata)
            flag, metavar = f.metadata.get("flag", flag), f.metadata.get("metavar")
            parser.add_argument(flag, action=_AppendToTuple, metavar=metavar, **common)
        elif kind.startswith("bool"):
            parser.add_argument(flag, nargs="?", const=True, type=parse_bool, **common)
        elif f.name.endswith("_bytes"):
            size_help = f"{cls.__name__}.{f.name}: a size in bytes, units allowed (default: {format_size(default)})"
            parser.add_argument(flag, type=parse_size, **{**common, "help": size_help})
        else:
            convert = int if kind.startswith("int") else float if kind.startswith("float") else str
            parser.add_argument(flag, type=convert, choices=choices.get(f.name), **common)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omniwalk", description="Serve composite any-to-any multimodal models.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_bench(sub)
    _add_make_tiny(sub)
    inspect = sub.add_parser("inspect", help="print a checkpoint's normalised config and parameter count")
    inspect.add_argument("model", type=Path, help="checkpoint directory or config.json")
    inspect.set_defaults(func=_inspect)
    return parser


def _add_serve(sub) -> None:
    """``serve``: its flags are the config dataclasses' fields (server, model, engine, media, families)."""
    import dataclasses

    from omniwalk.config import EngineConfig, ModelConfig, RayConfig, ServerConfig
    from omniwalk.media.limits import MediaLimits

    serve = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API")
    serve.add_argument(
        "--model",
        default=None,
        help="checkpoint directory, preset name (with --random-weights) or "
        "Hugging Face id ORG/NAME in the local cache (default: the embedded tiny model)",
    )
    from omniwalk.models.registry import all_options

    seen = {"model"}
    for cls in (ServerConfig, ModelConfig, EngineConfig, MediaLimits, RayConfig, *all_options()):
        _add_dataclass_flags(serve, cls, skip=seen)  # (families sharing a field share its flag)
        seen |= {f.name for f in dataclasses.fields(cls)}
    serve.set_defaults(func=_serve)


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="closed-loop load test of an OpenAI-compatible omni server")
    add, dflt = bench.add_argument, " (default: %(default)s)"
    add("--base-url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI API root" + dflt)
    add("--model-name", default=None, help="the model name the server expects (default: the first it lists)")
    add("--api-key", default=None, help="sent as a bearer token (default: none)")
    add("--paths", default="s2t,i2t,s2s,i2s", help="comma list of s2t,i2t,s2s,i2s,t2t,t2s,t2j" + dflt)
    add("--concurrency", default="1,4,16,32", help="comma list of in-flight request counts B" + dflt)
    add("--min-requests", type=int, default=50, help="N = max(min_requests, k * B) per cell" + dflt)
    add("--requests-per-concurrency", type=int, default=10, help="k in N = max(min_requests, k * B)" + dflt)
    add("--warmup-waves", type=int, default=1, help="unmeasured waves of B requests before a cell" + dflt)
    out_help = "folder for results.json, results.md and, with matplotlib, the charts"
    add("--out", type=Path, default=Path("bench-results"), help=out_help + dflt)
    bench.set_defaults(func=_bench)


def _add_make_tiny(sub) -> None:
    tiny = sub.add_parser("make-tiny", help="write a random-weight checkpoint directory")
    tiny.add_argument("out_dir", type=Path)
    tiny.add_argument(
        "--config",
        help="a config.json or a model family's preset name; default: the default family's tiny one",
    )
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--dtype", choices=_DTYPES, default="float32")
    tiny.add_argument("--max-shard-mb", type=float, default=2048.0, help="shard the weights above this size")
    tiny.add_argument("--no-weights", action="store_true", help="config + tokenizer only (for --random-weights)")
    tiny.add_argument(
        "--quantization",
        choices=("none", "fp8"),
        default="none",
        help="fp8: the family's quantised weights in the block-wise FP8 format (float8_e4m3fn + *_scale_inv)",
    )
    tiny.set_defaults(func=_make_tiny)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except OmniwalkError as e:
        print(f"omniwalk: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
