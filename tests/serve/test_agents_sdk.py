"""The OpenAI Agents SDK (``openai-agents``), unmodified, against a live tiny server: an ``Agent`` on
the SDK's default model provider (the Responses API), and on ``OpenAIChatCompletionsModel`` (chat
completions), calls a function tool, reads its result and returns a pydantic ``output_type``. On
random weights every call and every parsed answer is the grammars' doing (tool_choice "required" for
the first turn, the output type's JSON schema after)."""

import asyncio
from typing import Annotated

import openai
import pydantic
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_default_openai_client,
)

MODEL = "qwen3-omni"


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    warm: bool


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_agent_calls_a_tool_and_returns_its_output_type(base_url, api):
    calls = []

    @function_tool
    def get_weather(city: Annotated[str, pydantic.Field(max_length=12)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny, 24 C"

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    set_default_openai_client(client)
    agent = Agent(
        name="forecaster",
        instructions="Look the weather up, then answer.",
        model=MODEL if api == "responses" else OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=[get_weather],
        output_type=Forecast,
        # (the SDK resets tool_choice after a tool has run: the next turn answers)
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0.0, max_tokens=300
        ),
    )
    result = asyncio.run(Runner.run(agent, "Is it warm in Paris?", run_config=RunConfig(tracing_disabled=True)))
    assert len(calls) >= 1 and all(isinstance(city, str) for city in calls)
    assert isinstance(result.final_output, Forecast)
    kinds = [item.type for item in result.new_items]
    assert kinds[0] == "tool_call_item" and "tool_call_output_item" in kinds and kinds[-1] == "message_output_item"
