"""Training learns from exactly what was served: the record's prompt token ids when it has them,
the call's tools when a prompt must be rendered again, and a `max_length` that follows the
model's context instead of cutting agent prompts at 512 tokens."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from reef.protocol import Completion
from reef.sdk.recipe import StepContext
from reef.sdk.view import Turn
from reef.sdk.weights import LoraRecipeSettings, served_prompt, training_length

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def context_rendering(asked: list[dict[str, Any]]) -> StepContext:
    """A step context whose engine renders every prompt as [7, 7, 7] and keeps what it was
    asked."""

    def generate(body: dict[str, Any]) -> Completion:
        asked.append(body)
        return Completion(response={"choices": [{}]}, model="m", prompt_token_ids=[7, 7, 7])

    return StepContext(scenario="default", release_id="base", files={}, generate=generate)


def turn(**fields: Any) -> Turn:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return Turn(record_id="rec_1", messages=messages, answer={}, release_id="base", **fields)


def test_a_record_with_its_prompt_ids_trains_on_them_without_rendering() -> None:
    asked: list[dict[str, Any]] = []
    served = served_prompt(context_rendering(asked), turn(prompt_token_ids=[1, 2, 3]), {})
    assert served == [1, 2, 3] and asked == []


def test_a_record_without_them_is_rendered_with_the_tools_of_its_call() -> None:
    asked: list[dict[str, Any]] = []
    context = context_rendering(asked)
    cache: dict[str, list[int]] = {}
    assert served_prompt(context, turn(tools=[WEATHER_TOOL]), cache) == [7, 7, 7]
    assert asked[0]["tools"] == [WEATHER_TOOL]
    assert served_prompt(context, turn(tools=[WEATHER_TOOL]), cache) == [7, 7, 7]
    assert len(asked) == 1  # rendered once per record


def model_with_context(length: int | None) -> Any:
    config = SimpleNamespace(max_position_embeddings=length)
    return SimpleNamespace(model=SimpleNamespace(config=config))


@pytest.mark.parametrize(
    ("max_length", "context", "expected"),
    [(None, 8192, 8192), (1024, 8192, 1024), (None, None, 2048)],
)
def test_the_training_length_is_the_setting_or_the_models_context(
    max_length: int | None, context: int | None, expected: int
) -> None:
    settings = LoraRecipeSettings(max_length=max_length)
    assert training_length(settings, model_with_context(context)) == expected
