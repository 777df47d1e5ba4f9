"""What the distillation tests (sdft, sdpo, opd, and sft's hint distillation) share: a real
experience store with calls whose tokens the tiny random model's tokenizer wrote, and a step
context whose engine renders prompts with the tiny model's chat template (and keeps every
conversation it was asked to render)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reef.protocol import Completion
from reef.sdk.recipe import StepContext
from reef.store import ExperienceStore, Record, Report
from reef.testing.tiny import tiny_model_folder, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ExperienceStore]:
    with ExperienceStore(tmp_path / "experience.db") as opened:
        yield opened


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The prompt's token ids as the engine renders it: the chat template, the reply's opening."""
    text = tiny_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return list(tiny_tokenizer()(str(text))["input_ids"])


def answer_ids(text: str) -> list[int]:
    tokenizer = tiny_tokenizer()
    return [*tokenizer(text)["input_ids"], int(tokenizer.eos_token_id)]


def served(
    store: ExperienceStore,
    question: str,
    answer: str,
    score: float | None = None,
    feedback: Any = None,
    seed: int = 0,
    logprobs: bool = True,
) -> str:
    """A call served with its tokens (and their log-probs) recorded, and a report on it."""
    messages = [{"role": "user", "content": question}]
    ids = answer_ids(answer)
    record = Record(
        scenario="default",
        request={"messages": messages, "seed": seed},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="test",
        release_id="base",
        prompt_token_ids=render(messages),
        completion_token_ids=ids,
        completion_logprobs=[-1.0] * len(ids) if logprobs else None,
    )
    record_id = store.add_record(record).result()
    if score is not None or feedback is not None:
        store.add_report(Report("default", [record_id], score=score, feedback=feedback)).result()
    return record_id


@dataclass
class Engine:
    """Renders each conversation it is asked about, as the serving engine would."""

    asked: list[list[dict[str, Any]]] = field(default_factory=list)

    def generate(self, body: dict[str, Any]) -> Completion:
        self.asked.append(body["messages"])
        choice = {"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}
        return Completion(
            response={"choices": [choice]},
            model="tiny",
            prompt_token_ids=render(body["messages"]),
        )


def step_context(tiny_model: Path, work_dir: Path, engine: Engine) -> StepContext:
    return StepContext(
        scenario="default",
        release_id="base",
        files={},
        generate=engine.generate,
        model_path=tiny_model,
        work_dir=work_dir,
    )
