"""A second model family through the socket: the engine-core toy LM, registered as an installed
package registers one, run by ``Omni`` and served by ``omniwalk serve`` to the official client."""

import os
from pathlib import Path

import openai
import pytest
from helpers import toy_family
from helpers.live_server import launch
from helpers.toy_family import ToyFamily, decode, encode
from helpers.toy_lm import make_engine

from omniwalk import Omni
from omniwalk.engine.request import EngineRequest
from omniwalk.errors import InvalidRequestError
from omniwalk.models.registry import family_class

PROMPT = "Hello toy world"
N = 12


def toy_alone(text: str, n: int) -> str:
    """The oracle: the engine-core toy engine itself, no family, no Omni."""
    engine, _ = make_engine()
    req = EngineRequest("solo", ("lm",), {"seq": encode(text), "stop_at": len(text) + n})
    engine.add(req)
    while engine.has_unfinished():
        engine.step()
    return decode([e.data for e in req.events if e.kind == "text"])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return toy_family.install(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return ToyFamily.make_tiny(tmp_path_factory.mktemp("toy-lm"))


def test_omni_runs_an_installed_family(site, checkpoint, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    assert family_class(checkpoint) is ToyFamily
    omni = Omni(model=str(checkpoint), toy_kv_pages=64)  # (the family's own option)
    assert omni.config.family.toy_kv_pages == 64
    out = omni.generate({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N})
    assert out.text == toy_alone(PROMPT, N) and len(out.token_ids) == N and out.finish_reason == "length"
    with pytest.raises(InvalidRequestError, match="no audio output"):
        omni.add({"messages": [{"role": "user", "content": PROMPT}], "modalities": ["text", "audio"]})


def test_omniwalk_serve_serves_it_to_the_openai_client(site, checkpoint):
    root = Path(__file__).parents[2]
    path = [str(site), str(root / "tests"), str(root), os.environ.get("PYTHONPATH", "")]
    proc, base = launch(
        "--toy-kv-pages", "256", model=checkpoint, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    )
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["toy-lm"]
        messages, expected = [{"role": "user", "content": PROMPT}], toy_alone(PROMPT, N)
        reply = client.chat.completions.create(model="toy-lm", messages=messages, max_tokens=N, temperature=0.0)
        assert reply.choices[0].message.content == expected and reply.usage.completion_tokens == N
        stream = client.chat.completions.create(model="toy-lm", messages=messages, max_tokens=N, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
        with pytest.raises(openai.BadRequestError) as e:  # the toy has no audio output
            client.chat.completions.create(model="toy-lm", messages=messages, modalities=["text", "audio"])
        assert e.value.body["param"] == "modalities"
        with pytest.raises(openai.BadRequestError) as e:  # another family's fields are not this one's
            client.chat.completions.create(model="toy-lm", messages=messages, extra_body={"talker_top_k": 5})
        assert e.value.body["code"] == "unknown_parameter"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
