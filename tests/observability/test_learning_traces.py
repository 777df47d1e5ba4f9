"""The learning worker's traces: one trace per learning step, its gate under it and the publish
under the gate, with what each decided (SDK's in-memory exporter, a real worker and stores)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reef.config import load_config
from reef.engines.base import Engine
from reef.inference.model import LocalModel
from reef.learning.worker import LearningWorker
from reef.store import ExperienceStore
from reef.testing.scripted_engine import ScriptedEngine
from reef.tracing import Tracing
from tests.learning.test_learning_worker import failing_call
from tests.support.scripted import ECHO_RECIPE


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The served model, scripted: these tests are about the worker, not what a model says."""
    return ScriptedEngine("A scripted answer.")


def test_a_learning_step_is_one_trace_with_its_gate_and_publish(
    tmp_path: Path, engine: Engine
) -> None:
    (tmp_path / "recipes.py").write_text(ECHO_RECIPE)
    (tmp_path / "reef.yaml").write_text(
        f"state_dir: {tmp_path}/.reef\ngate:\n  policy: always\n"
        f"learning:\n  recipe: {tmp_path}/recipes.py:Echo\n  batch_size: 1\n"
    )
    config = load_config(tmp_path / "reef.yaml", env={})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ExperienceStore(config.experience_db) as store:
        learner = LearningWorker(config, store, LocalModel(engine))
        learner.workflow.tracing = Tracing(provider)
        failing_call(store)
        result = asyncio.run(learner.step("default"))
    assert result.outcome == "released"
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert sorted(spans) == ["reef.gate", "reef.learning.step", "reef.publish"]
    step, gate, publish = spans["reef.learning.step"], spans["reef.gate"], spans["reef.publish"]
    assert len({span.context.trace_id for span in spans.values()}) == 1
    assert step.parent is None
    assert gate.parent is not None and gate.parent.span_id == step.context.span_id
    assert publish.parent is not None and publish.parent.span_id == gate.context.span_id
    assert step.attributes["reef.recipe"] == "echo"
    assert step.attributes["reef.outcome"] == "released"
    assert step.attributes["reef.candidate.id"] == result.candidate_id
    assert gate.attributes["reef.gate.policy"] == "always"
    assert gate.attributes["reef.candidate.state"] == "released"
    assert publish.attributes["reef.release.id"] == "default@1"
