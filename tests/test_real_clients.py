"""Clients people put in front of the server, unchanged, against the real server on 127.0.0.1: LiteLLM's
context-window detection and openai-agents' ``Agent(tools=..., output_type=...)``."""

import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM would fetch its price list otherwise

import litellm  # noqa: E402
import openai  # noqa: E402
import pytest  # noqa: E402
from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel, Field  # noqa: E402

from tests.api_server import shared_server  # noqa: E402

pytestmark = pytest.mark.server

MODEL = "smollm"


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


def test_litellm_recognises_a_too_long_prompt_as_a_context_window_error(server):
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(model=f"openai/{MODEL}", api_base=f"{server.base_url}/v1", api_key="unused",
                           messages=[{"role": "user", "content": "hello " * 2000}], max_retries=0)


class Weather(BaseModel):
    city: str = Field(max_length=20)
    summary: str = Field(max_length=40)  # bounded, so that the answer always ends within max_tokens


def run_agent(server, question: str, **agent_options: object):
    """Greedy, one call a turn; the agent sends tools with a response_format and no tool_choice (auto)."""
    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        called.append(city)
        return Weather(city=city, summary="sunny").model_dump_json()

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        agent = Agent(name="weather", instructions="You report the weather.", tools=[get_weather], output_type=Weather,
                      model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                      model_settings=ModelSettings(temperature=0.0, parallel_tool_calls=False, max_tokens=80),
                      **agent_options)
        try:
            return await Runner.run(agent, question, max_turns=3)
        finally:
            await client.close()

    return asyncio.run(run()), called


def test_an_agent_with_tools_and_an_output_type_gets_its_typed_final_answer(server):
    result, called = run_agent(server, "Write a JSON object about London.")
    assert called == [] and isinstance(result.final_output, Weather)


def test_an_agent_with_tools_and_an_output_type_can_call_its_tool(server):
    result, called = run_agent(server, "What is the weather in Paris?", tool_use_behavior="stop_on_first_tool")
    assert called == ["Paris"]
    assert Weather.model_validate_json(result.final_output) == Weather(city="Paris", summary="sunny")
