"""What the Ray Serve path adds over ``omniwalk serve``: the same streamed chat requests against both,
on the same machine, in one run.

    python benchmarks/serving/ray_overhead.py --model CKPT --out benchmarks/results/cpu
    python benchmarks/serving/ray_overhead.py --model CKPT --out benchmarks/results/cpu \
        --stem ray_overhead_direct --ray-env RAY_SERVE_THROUGHPUT_OPTIMIZED=1     # Ray Serve's own mode
    python benchmarks/serving/ray_overhead.py --model CKPT --out /tmp/r --stream-interval 8 --tokens 256  # bursts

Each system serves one engine replica of ``--model`` (CPU). Cells: closed loop at concurrency 1 and 16,
streamed chat completions of ``--tokens`` tokens (``ignore_eos``, greedy), after one unmeasured wave; both
engines send text ``--stream-interval`` pieces to a chunk (``EngineConfig.stream_interval``; tokens are
counted from the usage chunk, SSE content chunks apart). Per cell: p50 / p90 end-to-end latency and time to
first token, tokens/s, and the CPU time per streamed token of each serving process: ``omniwalk serve``'s HTTP
process (its engine process excluded), and on Ray the ingress replica, Ray's HTTP proxy and the engine
replica's actor (its engine process excluded), read from /proc after the warm-up wave and after the cell,
as measured and above the process's idle rate (its CPU a second with no request in flight, measured for
``--idle-s`` once all are up: Ray's and Serve's own loops, health checks and metrics, which do not grow with
the load). Ray runs as a
one-node cluster started here (``ray.init``), the ingress and engine replicas as ``omniwalk serve --ray``
deploys them; both engines run one torch thread (Ray sets an actor's OMP_NUM_THREADS to its ``num_cpus``; the plain
server is given the same). Where Ray's direct ingress is on (``--ray-env``:
``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``, or its throughput-optimized mode), the ingress replica also listens on
a port of its own, and the Ray application is measured twice: through Ray's proxy ("ray") and on that port
("ray_direct"). The systems are up together and their cells alternate (``--rounds`` each; the figures are
medians over the rounds), so a machine shared with other work loads them alike. ``--pairs N`` then measures
the latency added at concurrency 1 request by request: N rounds of one request to each system in turn, the
median (and quartiles) of each Ray request's latency minus the plain server's of the same round (cells of
their own move by more than what Ray adds on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import machine, markdown_table, prompt_text, write_report  # noqa: E402

ENGINE_CPUS = 1  # each system's engine: one CPU, one torch thread


async def one_stream(http: httpx.AsyncClient, base: str, i: int, tokens: int) -> dict:
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": prompt_text(i)}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, num_tokens, num_chunks = time.perf_counter(), None, 0, 0
    async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                num_chunks += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    return {"e2e_s": end - start, "ttft_s": (first or end) - start, "tokens": num_tokens, "chunks": num_chunks}


async def run_cell(base: str, concurrency: int, num_requests: int, tokens: int, warm: Callable[[], None]):
    """The cell's records and seconds; ``warm`` is called between the warm-up wave and the measured requests."""
    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(one_stream(http, base, -1 - i, tokens) for i in range(concurrency)))  # warm-up wave
        warm()
        todo, records = iter(range(num_requests)), []

        async def worker():
            for i in todo:
                records.append(await one_stream(http, base, i, tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return records, time.perf_counter() - start


async def run_pairs(bases: dict[str, str], num_rounds: int, tokens: int) -> dict[str, list[dict]]:
    """Concurrency 1, request by request across the systems: each round sends one request to each system in
    turn (the order reversed every other round), so the requests of a round see the machine alike."""
    records = {name: [] for name in bases}
    async with httpx.AsyncClient(timeout=300) as http:
        for base in bases.values():
            await one_stream(http, base, -1, tokens)  # (warm-up)
        for i in range(num_rounds):
            for name in list(bases)[:: 1 if i % 2 == 0 else -1]:
                records[name].append(await one_stream(http, bases[name], i, tokens))
    return records


def paired_rows(records: dict[str, list[dict]]) -> list[dict]:
    """Per Ray path: the median and quartiles of its requests' latency minus the plain server's request of the
    same round (the same prompt and answer length)."""
    rows = []
    for path in [name for name in records if name != "plain"]:
        row = {"path": path, "rounds": len(records[path])}
        for figure in ("e2e_s", "ttft_s"):
            diffs = [1000 * (r[figure] - p[figure]) for r, p in zip(records[path], records["plain"], strict=True)]
            q1, median, q3 = statistics.quantiles(diffs, n=4)
            row |= {f"added_{figure[:-2]}_ms_q1": q1, f"added_{figure[:-2]}_ms_median": median}
            row |= {f"added_{figure[:-2]}_ms_q3": q3}
        rows.append(row)
    return rows


def cpu_s(pids: int | tuple[int, ...]) -> float:
    """CPU seconds of the processes alone (an engine process is a child, not counted)."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in (pids if isinstance(pids, tuple) else (pids,)))


def idle_rates(pids: dict[str, int | tuple[int, ...]], seconds: float) -> dict[str, float]:
    """CPU seconds a second each process spends with no request in flight (its background: Ray's and Serve's
    own loops, health checks, metrics)."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: (cpu_s(pid) - before[name]) / seconds for name, pid in pids.items()}


def measure(base: str, pids: dict[str, int], concurrency: int, args, idle: dict[str, float]) -> dict:
    """One cell: ``max(min_requests, 4 * concurrency)`` streamed requests, after a warm-up wave (its CPU not
    counted). CPU a token as measured, and above each process's ``idle`` rate over the cell's time."""
    num_requests = max(args.min_requests, 4 * concurrency)
    before = {}
    warm = lambda: before.update({name: cpu_s(pid) for name, pid in pids.items()})  # noqa: E731
    records, wall = asyncio.run(run_cell(base, concurrency, num_requests, args.tokens, warm))
    spent = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
    tokens = sum(r["tokens"] for r in records)
    e2e, ttft = sorted(r["e2e_s"] for r in records), sorted(r["ttft_s"] for r in records)
    row = {"concurrency": concurrency, "requests": len(records), "tokens": tokens, "wall_s": wall}
    row |= {"chunks": sum(r["chunks"] for r in records)}
    row |= {"p50_ms": 1000 * statistics.median(e2e), "p90_ms": 1000 * e2e[int(0.9 * (len(e2e) - 1))]}
    row |= {"ttft_p50_ms": 1000 * statistics.median(ttft), "tokens_per_s": tokens / wall}
    row |= {f"cpu_ms_per_token_{name}": 1000 * s / tokens for name, s in spent.items()}
    row |= {f"above_idle_cpu_ms_per_token_{name}": 1000 * (s - idle[name] * wall) / tokens for name, s in spent.items()}
    print(json.dumps(row), flush=True)
    return row


def median_row(rows: list[dict]) -> dict:
    """Per figure, the median over the rounds."""
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def wait_ready(base: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base} did not become ready")
        time.sleep(0.5)


def start_plain(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", args.model, "--port", str(args.port)]
    cmd += ["--stream-interval", str(args.stream_interval)]
    # the same torch threads as the Ray engine replica: Ray sets OMP_NUM_THREADS to an actor's num_cpus
    env = {**os.environ, "OMP_NUM_THREADS": str(ENGINE_CPUS)}
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{args.port}"
    wait_ready(base)
    return server, base


def start_ray(args) -> tuple[str, dict[str, int], float]:
    """The application on a one-node cluster started here: its URL, the serving processes, seconds to ready."""
    import ray
    from ray import serve
    from ray.util.state import list_actors

    from omniwalk.config import RayConfig, ServerConfig
    from omniwalk.media.limits import MediaLimits
    from omniwalk.serve.ray.app import application

    start = time.perf_counter()
    os.environ.update(dict(entry.split("=", 1) for entry in args.ray_env))  # (Ray's processes inherit it)
    ray.init(num_cpus=4, logging_level="ERROR", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port + 1})
    cfg = RayConfig(ray_engine_num_cpus=ENGINE_CPUS, ray_ingress_num_cpus=1)
    options = {"model": args.model, "stream_interval": args.stream_interval}
    serve.run(application(ServerConfig(), MediaLimits(), options, cfg), name="omniwalk", route_prefix="/")
    base = f"http://127.0.0.1:{args.port + 1}"
    wait_ready(base)
    pids = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True):
        for name, suffix in (("ingress", ":ingress"), ("engine_actor", ":engine"), ("proxy", "ProxyActor")):
            if actor.class_name.endswith(suffix):
                pids[name] = actor.pid
    if haproxy := tuple(p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "haproxy"):
        pids["haproxy"] = haproxy  # (Ray's HAProxy ingress, RAY_SERVE_ENABLE_HA_PROXY=1, in front of its proxy)
    return base, pids, time.perf_counter() - start


def direct_ingress(pid: int) -> str | None:
    """The URL the ingress replica (``pid``) answers on itself, where Ray's direct ingress is on: the
    HTTP port among its listening ones (its others are gRPC and Ray's own)."""
    ports = [c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    for port in sorted(ports):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            continue
    return None


def stop_ray() -> None:
    import ray
    from ray import serve

    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (served on the CPU)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    parser.add_argument("--tokens", type=int, default=32, help="streamed tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--min-requests", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2, help="cells per system, alternating between the systems")
    parser.add_argument("--port", type=int, default=18431, help="omniwalk serve's port; Ray's proxy takes the next")
    parser.add_argument(
        "--ray-env", action="append", default=[], metavar="NAME=VALUE", help="environment of Ray's processes"
    )
    parser.add_argument("--stem", default="ray_overhead", help="the results' file name")
    parser.add_argument("--stream-interval", type=int, default=1, help="both engines' stream_interval")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of each process's idle CPU, measured")
    parser.add_argument(
        "--pairs", type=int, default=0, help="rounds of paired latency at concurrency 1 after the cells (0: none)"
    )
    args = parser.parse_args()
    load = psutil.getloadavg()[0]
    server, plain_base = start_plain(args)
    try:
        ray_base, ray_pids, up_s = start_ray(args)
        systems = {"plain": (plain_base, {"http": server.pid}), "ray": (ray_base, ray_pids)}
        if (direct := direct_ingress(ray_pids["ingress"])) is not None:
            systems["ray_direct"] = (direct, ray_pids)
        time.sleep(args.idle_s / 2)  # (the systems settle after their start)
        idle = idle_rates({"http": server.pid, **ray_pids}, args.idle_s)
        print("idle CPU s/s:", json.dumps(idle), flush=True)
        rows = {name: [] for name in systems}
        for concurrency in args.concurrency:  # (alternating: every system sees the machine's load alike)
            rounds = {name: [] for name in systems}
            for _ in range(args.rounds):
                for name, (base, pids) in systems.items():
                    rounds[name].append(measure(base, pids, concurrency, args, idle))
            for name in systems:
                rows[name].append(median_row(rounds[name]))
        bases = {name: base for name, (base, _) in systems.items()}
        pairs = paired_rows(asyncio.run(run_pairs(bases, args.pairs, args.tokens))) if args.pairs else []
    finally:
        server.terminate()
        server.wait(60)
        stop_ray()
    data = {"machine": machine("cpu"), "args": vars(args), "load_before": load, "load_after": psutil.getloadavg()[0]}
    data |= {"ray_up_s": up_s, "idle_cpu_s_per_s": idle}
    data |= {"python": platform.python_version(), **rows, "added": (added := added_rows(rows)), "paired": pairs}
    tables = added_table(added) + (f"\n\n{paired_table(pairs)}" if pairs else "")
    write_report(args.out, args.stem, data, tables)
    print(tables)


def added_rows(rows: dict[str, list[dict]]) -> list[dict]:
    """Per Ray path and concurrency: what it adds to the plain server, and each process's CPU a token."""
    added = []
    for path in [name for name in rows if name != "plain"]:
        for base_row, ray_row in zip(rows["plain"], rows[path], strict=True):
            added.append(
                {
                    "path": path,
                    "concurrency": base_row["concurrency"],
                    "added_p50_ms": ray_row["p50_ms"] - base_row["p50_ms"],
                    "added_ttft_p50_ms": ray_row["ttft_p50_ms"] - base_row["ttft_p50_ms"],
                    "throughput_ratio": ray_row["tokens_per_s"] / base_row["tokens_per_s"],
                    "ingress_cpu_ms_per_token": ray_row["cpu_ms_per_token_ingress"],
                    "ingress_above_idle_cpu_ms_per_token": ray_row["above_idle_cpu_ms_per_token_ingress"],
                    "proxy_cpu_ms_per_token": ray_row["cpu_ms_per_token_proxy"],
                    "haproxy_cpu_ms_per_token": ray_row.get("cpu_ms_per_token_haproxy"),
                    "engine_actor_cpu_ms_per_token": ray_row["cpu_ms_per_token_engine_actor"],
                    "plain_http_cpu_ms_per_token": base_row["cpu_ms_per_token_http"],
                    "plain_http_above_idle_cpu_ms_per_token": base_row["above_idle_cpu_ms_per_token_http"],
                }
            )
    return added


TABLE = (  # header, key of an added row, format
    ("path", "path", "{}"),
    ("c", "concurrency", "{:.0f}"),
    ("added p50 ms", "added_p50_ms", "{:.1f}"),
    ("added TTFT p50 ms", "added_ttft_p50_ms", "{:.1f}"),
    ("throughput ratio", "throughput_ratio", "{:.2f}"),
    ("ingress CPU ms/token", "ingress_cpu_ms_per_token", "{:.3f}"),
    ("above idle", "ingress_above_idle_cpu_ms_per_token", "{:.3f}"),
    ("proxy CPU ms/token", "proxy_cpu_ms_per_token", "{:.3f}"),
    ("HAProxy CPU ms/token", "haproxy_cpu_ms_per_token", "{:.3f}"),
    ("engine actor CPU ms/token", "engine_actor_cpu_ms_per_token", "{:.3f}"),
    ("plain HTTP CPU ms/token", "plain_http_cpu_ms_per_token", "{:.3f}"),
    ("above idle", "plain_http_above_idle_cpu_ms_per_token", "{:.3f}"),
)


def added_table(added: list[dict]) -> str:
    cells = [["-" if a[key] is None else fmt.format(a[key]) for _, key, fmt in TABLE] for a in added]
    return markdown_table([header for header, _, _ in TABLE], cells)


def paired_table(pairs: list[dict]) -> str:
    head = ["path", "rounds", "added e2e ms: median (q1, q3)", "added TTFT ms: median (q1, q3)"]
    spread = "{:.1f} ({:.1f}, {:.1f})"
    cells = [
        [p["path"], str(p["rounds"])]
        + [spread.format(*(p[f"added_{f}_ms_{q}"] for q in ("median", "q1", "q3"))) for f in ("e2e", "ttft")]
        for p in pairs
    ]
    return markdown_table(head, cells)


if __name__ == "__main__":
    main()
