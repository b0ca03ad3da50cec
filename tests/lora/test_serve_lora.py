"""LoRA adapters over HTTP, on a live server (Qwen3-Omni tiny, 2 adapter slots, an API key) through the
official client: ``--lora`` at start, /v1/models with ``parent``, ``model`` picking an adapter, run-time
load/unload inside ``--lora-root`` (outside: 400), an unknown model (404 ``model_not_found``), an adapter
unloaded while a request uses it (the request finishes), concurrent requests over more adapters than slots
(each its adapter's answer; swaps in /metrics), a realtime session naming an adapter."""

import asyncio
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from helpers import qwen3_omni
from helpers.hf_oracle import TEST_ROOT, AdapterSpec, peft_model
from helpers.live_server import launch, until

KEY = "lora-test-key"
BASE = "qwen3-omni"


@pytest.fixture(scope="module")
def root() -> Path:
    """The server's adapter root: adapters sun, rain, snow (PEFT-written); ``outside`` lies next to it."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(qwen3_omni.checkpoint("tiny"))
    paths = peft_model(hf, {name: AdapterSpec(8, 16) for name in ("sun", "rain", "snow")}, seed=3)[1]
    top = Path(tempfile.mkdtemp(prefix="lora_serve_", dir=TEST_ROOT))
    for name, path in paths.items():
        shutil.copytree(path, top / "root" / name)
    shutil.copytree(paths["sun"], top / "outside")
    return top / "root"


@pytest.fixture(scope="module")
def base_url(root):
    flags = ("--lora", f"sun={root / 'sun'}", "--lora-root", str(root), "--max-loras", "2", "--max-lora-rank", "8")
    proc, base = launch(*flags, "--api-key", KEY)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0)


def post(base_url: str, route: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{base_url}/v1/{route}", json=body, headers=headers, timeout=60)


def answer(client, model: str, n: int = 8) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=qwen3_omni.MESSAGES,
        max_tokens=n,
        temperature=0.0,
        extra_body={"min_tokens": n},
    )
    assert reply.model == model and reply.choices[0].finish_reason == "length"
    return reply.choices[0].message.content


def test_models_lists_adapters_with_the_base_as_parent(client):
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {BASE, "sun"}
    assert models["sun"].model_extra["parent"] == BASE
    assert client.models.retrieve("sun").model_extra["parent"] == BASE


def test_model_picks_the_adapter_and_a_loaded_copy_answers_alike(client, base_url):
    base, adapted = answer(client, BASE), answer(client, "sun")
    assert adapted != base
    loaded = post(base_url, "load_lora_adapter", {"lora_name": "sun2", "lora_path": "sun"})  # (relative to the root)
    assert loaded.status_code == 200, loaded.text
    assert answer(client, "sun2") == adapted
    assert post(base_url, "unload_lora_adapter", {"lora_name": "sun2"}).status_code == 200


@pytest.mark.parametrize("path", ["../outside", "{root}/../outside", "/etc"])
def test_a_path_outside_the_root_is_400(base_url, root, path):
    reply = post(base_url, "load_lora_adapter", {"lora_name": "x", "lora_path": path.format(root=root)})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "lora_path"


def test_adapter_routes_need_the_key_and_a_valid_adapter(base_url, root):
    assert post(base_url, "load_lora_adapter", {"lora_name": "x", "lora_path": "rain"}, key=None).status_code == 401
    assert post(base_url, "unload_lora_adapter", {"lora_name": "sun"}, key="wrong").status_code == 401
    (root / "empty").mkdir(exist_ok=True)
    bad = post(base_url, "load_lora_adapter", {"lora_name": "x", "lora_path": "empty"})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    missing = post(base_url, "unload_lora_adapter", {"lora_name": "never"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_an_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        answer(client, "nope")
    assert e.value.code == "model_not_found" and e.value.body["param"] == "model"


def test_unloading_an_adapter_in_use_lets_its_request_finish(client, base_url):
    assert post(base_url, "load_lora_adapter", {"lora_name": "rain", "lora_path": "rain"}).status_code == 200
    n = 400  # (seconds of decoding on the CPU: the unload lands while the request runs)
    stream = client.chat.completions.create(
        model="rain",
        messages=qwen3_omni.MESSAGES,
        max_tokens=n,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": n},
    )
    chunks = iter(stream)
    next(chunks)
    reply = post(base_url, "unload_lora_adapter", {"lora_name": "rain"})
    assert reply.status_code == 200, reply.text
    rest = list(chunks)
    assert rest[-1].usage.completion_tokens == n
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
    assert "rain" not in {m.id for m in client.models.list()}
    with pytest.raises(openai.NotFoundError):
        answer(client, "rain")


def test_more_adapters_than_slots_serve_concurrent_requests_and_count_swaps(client, base_url):
    for name in ("rain", "snow"):
        assert post(base_url, "load_lora_adapter", {"lora_name": name, "lora_path": name}).status_code == 200
    models = [BASE, "sun", "rain", "snow"]
    alone = {model: answer(client, model) for model in models}
    assert len(set(alone.values())) == 4
    lock, errors = threading.Lock(), []

    def one(i: int) -> tuple[str, str]:
        try:
            return models[i % 4], answer(client, models[i % 4])
        except Exception as e:  # noqa: BLE001 - collected: no request may fail
            with lock:
                errors.append(e)
            raise

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert not errors
    assert all(text == alone[model] for model, text in results)
    metrics = httpx.get(f"{base_url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    swaps = [line for line in metrics.splitlines() if 'quantity="lora_swaps"' in line and not line.startswith("#")]
    assert swaps and float(swaps[0].split()[-1]) > 0


def test_speech_and_responses_take_the_adapter_too(client):
    # (Qwen3-Omni's talker reads the thinker's states at media positions only: a given text's speech from a
    # text-only prompt is the base's; the oracle tests hold adapted speech to HF's)
    frames = {"max_audio_frames": 16}
    speech = {"input": "hello there", "voice": "ethan", "response_format": "pcm", "extra_body": frames}
    assert len(client.audio.speech.create(model="sun", **speech).content) > 0
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="nope", **speech)
    asked = {"input": "hello", "max_output_tokens": 8, "temperature": 0.0}
    replies = {m: client.responses.create(model=m, **asked) for m in (BASE, "sun")}
    assert replies["sun"].model == "sun" and replies["sun"].output_text != replies[BASE].output_text


def test_a_realtime_session_naming_an_adapter_runs_it(client, base_url):
    """``?model=`` naming an adapter: the session's answers are the adapter's (a chat's, with that model);
    any other name is served by the base model."""
    ws_url = base_url.replace("http", "ws", 1) + "/v1"
    sdk = openai.AsyncOpenAI(base_url=f"{base_url}/v1", websocket_base_url=ws_url, api_key=KEY, max_retries=0)
    greedy = {"temperature": 0.0, "ignore_eos": True}

    async def text_of(model: str) -> tuple[str, str]:
        async with sdk.realtime.connect(model=model) as conn:
            created = await conn.recv()
            update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, "output_modalities": ["text"]}
            await conn.session.update(session={**update, "max_output_tokens": 8, **greedy})
            text = {"type": "input_text", "text": "hello there"}
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [text]})
            await conn.response.create()
            events = await until(conn)
        return created.session.model, "".join(e.delta for e in events if e.type == "response.output_text.delta")

    def chat_of(model: str) -> str:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=8,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        return reply.choices[0].message.content

    (sun_model, sun), (other_model, other) = (asyncio.run(text_of(m)) for m in ("sun", "gpt-realtime"))
    assert (sun_model, other_model) == ("sun", BASE)
    assert sun == chat_of("sun") and other == chat_of(BASE) and sun != other
