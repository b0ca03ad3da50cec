"""Fixtures the serve tests share: a live tiny server per test module, and the official client on it (a
module that needs another server defines its own ``base_url``)."""

import openai
import pytest
from helpers.live_server import server


@pytest.fixture(scope="module")
def base_url():
    with server() as base:
        yield base


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
