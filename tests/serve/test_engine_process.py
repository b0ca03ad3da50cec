"""The engine process + async client: the concurrent workload equals in-process runs alone."""

import asyncio

import numpy as np
import pytest
from helpers.qwen3_omni import alone, checkpoint, workload

from omniwalk.serve.engine_client import EngineClient, EngineRequestError
from omniwalk.serve.wire import Finished

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


async def collect(client: EngineClient, request: dict) -> dict:
    text, audio = [], []
    async for event in client.generate(request):
        if isinstance(event, Finished):
            return {"deltas": text, "chunks": audio, **event.output}
        (text if event.kind == "text" else audio).append(event.data)


async def scenario():
    client = EngineClient(model=checkpoint("tiny"), vocoder_max_batch=1)
    try:
        await client.start()
        requests = workload()
        outs = await asyncio.gather(*(collect(client, r) for r in requests))
        bad = await asyncio.gather(
            collect(client, {"messages": [{"role": "user", "content": [{"type": "file"}]}]}),
            collect(client, {**requests[4], "request_id": "bad-voice", "voice": "nobody"}),
            return_exceptions=True,
        )
        after = await collect(client, {**requests[0], "request_id": "after"})
        return requests, outs, bad, after, client.is_alive
    finally:
        client.close()


def test_engine_process_matches_in_process_runs_alone():
    requests, outs, bad, after, alive = asyncio.run(scenario())
    for i, (request, out) in enumerate(zip(requests, outs, strict=True)):
        ref = alone(i)
        assert out["request_id"] == request["request_id"]
        assert out["token_ids"] == ref.token_ids and out["text"] == ref.text == "".join(out["deltas"])
        assert out["finish_reason"] == ref.finish_reason
        if ref.codes is not None:
            assert np.array_equal(out["codes"], ref.codes.numpy())
            streamed = np.concatenate(out["chunks"])
            assert np.array_equal(streamed, out["audio"])
            assert np.array_equal(out["audio"], ref.audio.numpy())  # vocoder_max_batch=1: bit for bit
    assert all(isinstance(e, EngineRequestError) and e.bad_request for e in bad)
    assert "unknown content type" in str(bad[0]) and "unknown voice" in str(bad[1])
    assert after["token_ids"] == alone(0).token_ids and alive
