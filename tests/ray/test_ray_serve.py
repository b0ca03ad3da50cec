"""omniwalk as a Ray Serve application on a real two-node Ray cluster (``ray.cluster_utils.Cluster`` on
loopback, one for the module): two engine replicas, one on each node, behind Ray's HTTP proxy, used
with the official ``openai`` client. Requests spread over both replicas; a conversation's later turns
land on the replica holding its prefix; a killed engine process loses no request whose client had seen
no output, Ray replaces its replica; autoscaling goes 1 -> 2 -> 1 replicas without a failed request;
Ray's metrics carry every engine replica's stats; ``omniwalk serve --ray ADDRESS`` deploys and stops."""

import asyncio
import base64
import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
import wave

import httpx
import openai
import pytest
import ray
from helpers.hf_oracle import AdapterSpec, peft_model
from helpers.live_server import engine_pids, free_port, until
from helpers.qwen3_omni import checkpoint
from ray import serve
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from omniwalk import Omni
from omniwalk.config import RayConfig, ServerConfig
from omniwalk.media.limits import MediaLimits
from omniwalk.serve.ray.app import application
from omniwalk.serve.ray.client import IDLE_CONNECTION_S, RayEngines
from omniwalk.serve.ray.router import AffinityRouter

ENGINE_CPUS = 1.5  # one engine replica fits a node (each node offers 2 CPUs)
GREEDY = {"temperature": 0.0, "max_tokens": 4}


def options(**extra) -> dict:
    return {"model": checkpoint("tiny"), **extra}


@pytest.fixture(scope="module")
def adapter() -> str:
    """A LoRA adapter of the tiny model, written by PEFT: ``a0=PATH``, what ``--lora`` takes."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint("tiny"))
    return f"a0={peft_model(hf, {'a0': AdapterSpec(8, 16)}, seed=3)[1]['a0']}"


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


def deploy(base: str, server: ServerConfig, cfg: RayConfig, **extra) -> None:
    serve.run(application(server, MediaLimits(), options(**extra), cfg), name="omniwalk", route_prefix="/")
    deadline = time.monotonic() + 120
    while httpx.get(f"{base}/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the ingress did not become ready"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def base_url(cluster, adapter):
    cfg = RayConfig(ray_engine_num_cpus=ENGINE_CPUS, ray_ingress_num_cpus=0.1)
    deploy(cluster, ServerConfig(data_parallel=2, shutdown_grace_s=2), cfg, loras=(adapter,))
    return cluster


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def per_replica(base: str, stage: str, quantity: str) -> dict[str, float]:
    """omniwalk_engine{replica, stage, quantity} from /metrics, by replica id."""
    out = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("omniwalk_engine{") and f'quantity="{quantity}"' in line and f'stage="{stage}"' in line:
            out[line.split('replica="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def served_after(base: str, before: dict[str, float], num_requests: int, timeout: float = 10.0) -> dict[str, float]:
    """The replicas' served counts once ``num_requests`` more than ``before`` are in (a replica's count reaches the
    ingress with its Report, just after the request's response)."""
    deadline = time.monotonic() + timeout
    while True:
        after = per_replica(base, "replica", "served")
        if sum(after.values()) >= sum(before.values()) + num_requests or time.monotonic() > deadline:
            return after
        time.sleep(0.02)


def engine_nodes() -> list[str]:
    actors = list_actors(filters=[("state", "=", "ALIVE")], detail=True)
    return [a.node_id for a in actors if a.class_name.endswith(":engine")]


def test_two_engine_replicas_on_two_nodes_serve_chat_speech_and_realtime(client, base_url):
    nodes = engine_nodes()
    assert len(nodes) == 2 and len(set(nodes)) == 2
    answer = client.chat.completions.create(
        model="qwen3-omni", messages=[{"role": "user", "content": "hello"}], **GREEDY
    )
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 4
    speech = client.audio.speech.create(model="qwen3-omni", input="hi", voice="ethan", response_format="wav")
    with wave.open(io.BytesIO(speech.read())) as w:
        assert w.getnframes() > 0
    stream = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "say hi"}],
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"},
        stream=True,
        **{**GREEDY, "max_tokens": 3},
    )
    audio = b"".join(base64.b64decode(_audio_data(c)) for c in stream if _audio_data(c))
    assert len(audio) > 0
    assert _realtime_turn(base_url) == 3


def test_the_engine_replicas_serve_the_adapters_given_at_start(client, adapter):
    """``--lora`` through Ray: listed with its parent, and a chat naming it answers as the engine does with it."""
    assert {m.id: getattr(m, "parent", None) for m in client.models.list().data}["a0"] == "qwen3-omni"
    messages = [{"role": "user", "content": "what is the weather like?"}]
    answers = {
        model: client.chat.completions.create(model=model, messages=messages, **{**GREEDY, "max_tokens": 8})
        for model in ("qwen3-omni", "a0")
    }
    assert answers["a0"].model == "a0"
    offline = Omni(model=checkpoint("tiny"), loras=(adapter,))
    expected = {
        name: offline.generate({"messages": messages, "max_tokens": 8, "temperature": 0.0, "lora": name}).text
        for name in (None, "a0")
    }
    assert answers["a0"].choices[0].message.content == expected["a0"] != expected[None]
    assert answers["qwen3-omni"].choices[0].message.content == expected[None]


def _audio_data(chunk) -> str | None:
    audio = getattr(chunk.choices[0].delta, "audio", None) if chunk.choices else None
    return getattr(audio, "data", None) if audio is not None else None


def _realtime_turn(base: str) -> int:
    async def talk():
        sdk = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", websocket_base_url=f"ws{base[4:]}/v1")
        async with sdk.realtime.connect(model="qwen3-omni") as conn:
            await conn.recv()
            session = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 3}
            await conn.session.update(session={**session, "audio": {"input": {"turn_detection": None}}})
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}
            await conn.conversation.item.create(item=item)
            await conn.response.create()
            events = await until(conn)
        return events[-1].response.usage.output_tokens

    return asyncio.run(talk())


def test_concurrent_requests_spread_over_both_replicas(client, base_url):
    """24 conversations at once: their keys hash to both replicas, and a replica more than
    ``routing_max_excess`` requests ahead of the other passes the next ones on."""
    before = per_replica(base_url, "replica", "served")

    async def load():
        sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        texts = [f"question {i}" for i in range(24)]
        calls = [
            sdk.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": t}], **GREEDY)
            for t in texts
        ]
        return await asyncio.gather(*calls)

    assert all(a.usage.completion_tokens == 4 for a in asyncio.run(load()))
    after = served_after(base_url, before, 24)
    gained = {name: after[name] - before.get(name, 0) for name in after}
    assert len(gained) == 2 and min(gained.values()) >= 4, gained


def test_conversations_keep_to_the_replica_holding_their_prefix_and_spread_over_both(client, base_url):
    """Ten conversations, turn after turn, one request at a time: by load alone every request would go to the
    same idle replica; by affinity each conversation keeps to its key's replica and the keys spread over both
    (all ten on one replica: a 2 in 1024 chance)."""
    topics = ["weather", "sea", "ships", "storms", "harbours", "islands", "whales", "stars", "maps", "tides"]
    conversations = [
        [
            {"role": "system", "content": f"You answer briefly, in one or two short words, about {topic}. " * 4},
            {"role": "user", "content": f"what do you know about {topic} in the town by the sea?"},
        ]
        for topic in topics
    ]
    homes = [set() for _ in conversations]
    ahead_before = sum(per_replica(base_url, "ingress", "sent_ahead").values())
    for turn in range(3):
        for home, messages in zip(homes, conversations, strict=True):
            before = per_replica(base_url, "replica", "served")
            answer = client.chat.completions.create(model="qwen3-omni", messages=messages, **GREEDY)
            after = served_after(base_url, before, 1)
            home |= {name for name in after if after[name] > before.get(name, 0)}
            messages += [{"role": "assistant", "content": answer.choices[0].message.content}]
            messages += [{"role": "user", "content": f"and tomorrow, turn {turn}?"}]
        time.sleep(0.3)  # (the replicas' idle stats, with this turn's prefix hits, reach their next reports)
    assert all(len(home) == 1 for home in homes), homes
    replicas = set().union(*homes)
    assert len(replicas) == 2, homes
    prefix_tokens = per_replica(base_url, "thinker", "prefix_tokens")
    assert all(prefix_tokens[name] > 0 for name in replicas), prefix_tokens
    # the ingress knew both engines: it sent (nearly) every request there as the router chose, before the Ray
    # call reached the replica (a race may let the call's reply come first)
    assert sum(per_replica(base_url, "ingress", "sent_ahead").values()) - ahead_before >= 27
    assert sum(per_replica(base_url, "ingress", "withdrawn").values()) == 0


def test_a_client_that_hangs_up_mid_stream_aborts_its_request_in_the_engine(client, base_url):
    messages = [{"role": "user", "content": "a story that never ends, please"}]
    body = {"model": "qwen3-omni", "messages": messages, "max_tokens": 4000, "stream": True, "ignore_eos": True}

    def unfinished_beside_a_turn() -> float:
        """The most unfinished requests a replica reports after a short turn of the same conversation (which
        goes to the same replica, and reports that replica's count once it has itself finished)."""
        before = per_replica(base_url, "replica", "served")
        client.chat.completions.create(model="qwen3-omni", messages=messages, **GREEDY)
        served_after(base_url, before, 1)
        return max(per_replica(base_url, "replica", "unfinished").values())

    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines, chunks = response.iter_lines(), 0
        while chunks < 3:
            chunks += next(lines).startswith("data: {")
        assert unfinished_beside_a_turn() == 1  # (the story runs on)
        lines.close()  # (closes the connection)
    time.sleep(1.0)
    assert unfinished_beside_a_turn() == 0


def engine_replicas() -> dict[str, int]:
    """The live engine replicas: Ray replica id -> its actor's process id."""
    actors = list_actors(filters=[("state", "=", "ALIVE")], detail=True)
    return {a.name.rsplit("#", 1)[1]: a.pid for a in actors if a.class_name.endswith(":engine")}


KINDS = ("stream", "chat", "stream_audio", "speech")


async def one_request(sdk: openai.AsyncOpenAI, i: int) -> dict:
    """One request of a mixed load: its kind, whether output reached the client, and how it ended."""
    kind, outcome = KINDS[i % len(KINDS)], {"kind": KINDS[i % len(KINDS)], "output": False, "error": None}
    messages = [{"role": "user", "content": f"tell me about number {i}"}]
    long = {"temperature": 0.0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}
    try:
        if kind == "speech":
            await sdk.audio.speech.create(model="qwen3-omni", input=f"number {i}", voice="ethan", response_format="wav")
        elif kind == "chat":
            await sdk.chat.completions.create(model="qwen3-omni", messages=messages, **long)
        else:
            audio = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}
            extra = audio if kind == "stream_audio" else {}
            stream = await sdk.chat.completions.create(
                model="qwen3-omni", messages=messages, stream=True, **long, **extra
            )
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                outcome["output"] |= bool(delta and (delta.content or getattr(delta, "audio", None)))
    except openai.APIError as e:
        outcome["error"] = (getattr(e, "status_code", None), getattr(e, "code", None) or (e.body or {}).get("code"))
    return outcome


async def mixed_load(base: str, num_requests: int, concurrency: int, on_done=None) -> list[dict]:
    sdk = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    todo, results = iter(range(num_requests)), []

    async def worker():
        for i in todo:
            results.append(await one_request(sdk, i))
            if on_done is not None:
                on_done(len(results))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def test_a_killed_engine_process_loses_no_request_without_output_and_ray_replaces_it(client, base_url):
    victim, actor_pid = sorted(engine_replicas().items())[0]
    (engine_pid,) = engine_pids(actor_pid)
    killed = []

    def kill_after(done: int) -> None:
        if done == 30 and not killed:
            os.kill(engine_pid, signal.SIGKILL)
            killed.append(time.monotonic())

    results = asyncio.run(mixed_load(base_url, 100, 16, kill_after))
    assert killed and len(results) == 100
    failed = [r for r in results if r["error"] is not None]
    # only streams whose client had output fail (with the documented error): the others were sent again
    assert all(r["kind"].startswith("stream") and r["output"] for r in failed), failed
    assert len(failed) <= 16 and all(r["error"][1] == "engine_unavailable" for r in failed), failed
    deadline = killed[0] + 120
    while True:  # Ray replaces the replica: two live replicas again, the victim not among them, both serve
        replicas = engine_replicas()
        if len(replicas) == 2 and victim not in replicas:
            before = per_replica(base_url, "replica", "served")
            asyncio.run(mixed_load(base_url, 8, 4))
            after = per_replica(base_url, "replica", "served")
            if all(after.get(name, 0) > before.get(name, 0) for name in replicas):
                break
        assert time.monotonic() < deadline, replicas
        time.sleep(1)


def test_autoscaling_goes_to_two_replicas_under_load_and_back_to_one_when_idle(cluster):
    serve.delete("omniwalk")
    cfg = RayConfig(ray_engine_num_cpus=ENGINE_CPUS, ray_ingress_num_cpus=0.1, ray_min_replicas=1, ray_max_replicas=2)
    fast = {"ray_target_ongoing_requests": 2, "ray_upscale_delay_s": 1, "ray_downscale_delay_s": 3}
    deploy(cluster, ServerConfig(shutdown_grace_s=10), dataclasses.replace(cfg, **fast, ray_autoscaling_window_s=2))
    seen = [len(engine_replicas())]

    async def load_until(target: int, concurrency: int) -> list[dict]:
        """Requests at ``concurrency`` until the engine deployment has ``target`` replicas."""
        sdk = openai.AsyncOpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=120)
        results, done, deadline = [], asyncio.Event(), time.monotonic() + 120

        async def worker():
            while not done.is_set():
                results.append(await one_request(sdk, 4 * len(results) + 1))  # (non-streamed chats)

        async def watch():
            while seen[-1] != target:
                assert time.monotonic() < deadline, seen
                await asyncio.sleep(1)
                if (n := len(await asyncio.to_thread(engine_replicas))) != seen[-1]:
                    seen.append(n)
            done.set()

        await asyncio.gather(watch(), *(worker() for _ in range(concurrency)))
        return results

    results = asyncio.run(load_until(2, 8)) + asyncio.run(load_until(1, 1))
    assert seen == [1, 2, 1] and len(results) > 0
    assert [r for r in results if r["error"] is not None] == []


def test_rays_metrics_carry_every_engine_replicas_stats_beside_ray_serves_own(base_url):
    replicas, deadline = set(engine_replicas()), time.monotonic() + 60
    while True:
        ports = [node["MetricsExportPort"] for node in ray.nodes() if node["Alive"]]
        text = "".join(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text for port in ports)
        engine = [line for line in text.splitlines() if line.startswith("ray_omniwalk_engine{")]
        if all(any(name in line for line in engine) for name in replicas) and "ray_serve_" in text:
            break
        assert time.monotonic() < deadline, (replicas, engine[:4])
        time.sleep(2)
    assert any('stage="thinker"' in line and 'quantity="kv_pages_total"' in line for line in engine)


def test_omniwalk_serve_ray_deploys_on_the_cluster_and_stops_on_sigterm(cluster):
    serve.delete("omniwalk")
    flags = ["--ray", ray.get_runtime_context().gcs_address, "--ray-engine-num-cpus", "1", "--shutdown-grace-s", "2"]
    cmd = [sys.executable, "-m", "omniwalk.cli", "serve", "--model", checkpoint("tiny"), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # (Serve's proxy already listens: the application joins it)
            lines.append(line)
            if line.startswith(("ready:", "omniwalk: error")):
                break
        assert lines[-1].startswith("ready:"), "".join(lines)
        client = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0)
        hello = [{"role": "user", "content": "hi"}]
        answer = client.chat.completions.create(model="qwen3-omni", messages=hello, **GREEDY)
        assert answer.usage.completion_tokens == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "omniwalk" not in serve.status().applications
    finally:
        proc.kill()


def test_an_ingress_closes_connections_to_engine_processes_left_idle():
    """An endpoint left behind (its replica scaled down or replaced) is closed once idle, on the next request's
    connection; one with a request in flight, or idle for less, is kept."""

    class Handle:
        def options(self, **_):
            return self

        generate = None

    async def run():
        engines = RayEngines(Handle(), RayConfig())
        gone, busy, recent = (engines._connection(f"tcp://127.0.0.1:{port}") for port in (1, 2, 3))
        busy.queues["r"] = asyncio.Queue()
        for connection in (gone, busy):
            connection.last_used -= IDLE_CONNECTION_S + 1
        engines._connection("tcp://127.0.0.1:4")
        kept, closed = set(engines.connections), (gone.socket.closed, recent.socket.closed)
        engines.close()
        return kept, *closed

    kept, gone_closed, recent_closed = asyncio.run(run())
    assert kept == {f"tcp://127.0.0.1:{port}" for port in (2, 3, 4)}
    assert gone_closed and not recent_closed


def test_the_router_counts_a_request_from_its_routing_to_its_completion_in_any_order():
    """Ray may report a call's completion before its routing (the call ended before its acceptance was read)
    and reports completions of rejected attempts, never routed: no count is left behind by either, and
    routings still count until their completions."""
    from types import SimpleNamespace

    router = object.__new__(AffinityRouter)
    router.initialize_state()

    def request(rid: str):
        return SimpleNamespace(metadata=SimpleNamespace(internal_request_id=rid))

    a, b = SimpleNamespace(unique_id="a"), SimpleNamespace(unique_id="b")
    router.on_request_routed(request("1"), a, None)  # in order
    router.on_request_completed(b, "2")  # completed before its routing
    router.on_request_routed(request("2"), b, None)
    router.on_request_completed(a, "3")  # a rejected attempt on a, then routed to b
    router.on_request_routed(request("3"), b, None)
    router.on_request_routed(request("4"), a, None)
    assert router.outstanding == {"a": 2, "b": 1}
    for replica, rid in ((a, "1"), (b, "3"), (a, "4")):
        router.on_request_completed(replica, rid)
    assert router.outstanding == {"a": 0, "b": 0} and not router.running
