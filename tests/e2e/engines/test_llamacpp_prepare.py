"""`reef model prepare`: a copy of the GGUF in another weight format, kept only when it is faster
and answers within the bound, and loaded by `reef serve` in place of the file.

The drift checks and the conversion run the real llama.cpp on the embedded model. The choice
rule is tested with timings given by the test (`speed` replaced), since which format is faster
depends on the machine; what the real timings are is bench/speed/weight_formats.py's job. The
rule's tests are given their copies too (`convert` replaced by a file copy): the source itself,
which answers as it does, or the q4_0 copy the real conversion wrote once for the module, which
drifts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli import app
from reef.config import load_config
from reef.engines import build_engine
from reef.engines.llamacpp import embedded_model_path
from reef.engines.llamacpp import prepare as preparing
from reef.engines.llamacpp.convert import convert
from reef.engines.llamacpp.prepare import Speed, drift, prepare, prepared_copy
from reef.protocol import ChatRequest
from tests.conftest import SMALL_ENGINE, write_config

PROBES = ("What is the capital of France?", "Write a haiku about the sea.")
SOURCE_SPEED = Speed(prompt_tokens_per_s=100.0, decode_tokens_per_s=100.0)


@pytest.fixture(autouse=True)
def short_probe_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve greedy tokens a probe, not 48: a q4_0 copy drifts from the first of them, and a
    file read against itself does not over any number."""
    monkeypatch.setattr(preparing, "PROBE_TOKENS", 12)


@pytest.fixture(scope="module")
def q4_0_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("formats") / "model.q4_0.gguf"
    convert(embedded_model_path(), "q4_0", out, threads=2)
    return out


def test_a_file_read_against_itself_shows_no_drift() -> None:
    source = embedded_model_path()
    same = drift(source, source, n_threads=2, probes=PROBES)
    assert same.identical_answers == same.probes == 2
    assert same.same_top_token == 1.0
    assert same.mean_abs_logprob_diff == 0.0


def test_a_requantized_copy_drifts_and_a_zero_bound_refuses_it(q4_0_copy: Path) -> None:
    copied = drift(embedded_model_path(), q4_0_copy, n_threads=2, probes=PROBES)
    assert copied.mean_abs_logprob_diff > 0.0
    assert not copied.within(0.0)
    assert copied.within(copied.mean_abs_logprob_diff)


def _copied(copies: dict[str, Path] | None = None) -> object:
    """A `convert` that writes the file the test names for a format (the source by default)."""

    def convert(source: Path, kind: str, out: Path, threads: int = 0) -> float:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile((copies or {}).get(kind, source), out)
        return 0.0

    return convert


def _timed(speeds: dict[str, Speed]) -> object:
    def speed(path: Path, n_threads: int, **_: object) -> Speed:
        for kind, measured in speeds.items():
            if path.name.endswith(f".{kind}.gguf"):
                return measured
        return SOURCE_SPEED

    return speed


def test_the_fastest_copy_within_the_bounds_is_kept_and_the_others_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preparing, "PROBES", PROBES)
    monkeypatch.setattr(preparing, "convert", _copied())
    monkeypatch.setattr(
        preparing,
        "speed",
        _timed(
            {
                "q8_0": Speed(170.0, 99.0),  # faster prompts, decode within the floor: kept
                "bf16": Speed(190.0, 60.0),  # fastest prompts, decodes too slowly
            }
        ),
    )
    source = embedded_model_path()
    kept, trials, _ = prepare(source, tmp_path, ["q8_0", "bf16"], n_threads=2)
    assert kept is not None and kept.format == "q8_0"
    refusals = {trial.format: trial.refused for trial in trials}
    assert refusals["q8_0"] is None
    assert "decodes at 0.60x" in (refusals["bf16"] or "")
    assert sorted(path.name for path in (tmp_path / "models").glob("*.gguf")) == [
        f"{source.stem}.q8_0.gguf"
    ]
    assert prepared_copy(source, tmp_path) == kept


def test_no_copy_stays_when_none_is_faster_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, q4_0_copy: Path
) -> None:
    monkeypatch.setattr(preparing, "PROBES", PROBES)
    monkeypatch.setattr(preparing, "convert", _copied({"q4_0": q4_0_copy}))
    monkeypatch.setattr(preparing, "speed", _timed({"q4_0": Speed(300.0, 150.0)}))
    kept, trials, _ = prepare(embedded_model_path(), tmp_path, ["q4_0"], 2, max_drift=0.0)
    assert kept is None
    assert "answers drift" in (trials[0].refused or "")
    assert not list((tmp_path / "models").glob("*.gguf"))
    assert prepared_copy(embedded_model_path(), tmp_path) is None


def test_serve_loads_the_prepared_copy_under_the_files_name_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(embedded_model_path().read_bytes())
    monkeypatch.setattr(preparing, "PROBES", PROBES)
    monkeypatch.setattr(preparing, "convert", _copied())
    monkeypatch.setattr(preparing, "speed", _timed({"q8_0": Speed(170.0, 100.0)}))
    kept, _, _ = prepare(source, tmp_path / ".reef", ["q8_0"], n_threads=2)
    assert kept is not None
    project = f"state_dir: {tmp_path / '.reef'}\n" + SMALL_ENGINE + f"    model: {source}\n"
    config = load_config(write_config(tmp_path, project), env={})
    engine = build_engine(config.engine, state_dir=config.state_dir)
    assert engine.model_path == Path(kept.path)  # type: ignore[attr-defined]
    assert engine.model == "model"  # clients keep asking for the file's name

    unprepared = load_config(
        write_config(tmp_path, project + "    prepared: false\n"),
        env={},
    )
    file_engine = build_engine(unprepared.engine, state_dir=unprepared.state_dir)
    assert file_engine.model_path == source  # type: ignore[attr-defined]

    os.utime(source, ns=(1, 1))  # the file is another one now: its copy no longer stands for it
    rebuilt = build_engine(config.engine, state_dir=config.state_dir)
    assert rebuilt.model_path == source  # type: ignore[attr-defined]


def test_a_converted_copy_serves_requests(q4_0_copy: Path) -> None:
    from reef.engines.llamacpp import LlamaCppEngine

    async def serve_one() -> dict[str, int]:
        engine = LlamaCppEngine(model_path=q4_0_copy, n_ctx=512, n_threads=2)
        await engine.start()
        try:
            request = ChatRequest.model_validate(
                {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
            )
            return (await engine.complete(request)).usage or {}
        finally:
            await engine.close()

    assert 1 <= asyncio.run(serve_one())["completion_tokens"] <= 3


def test_the_cli_refuses_an_unknown_format_and_forgets_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, f"state_dir: {tmp_path / '.reef'}\n" + SMALL_ENGINE)
    runner = CliRunner()
    result = runner.invoke(app, ["model", "prepare", "--format", "q3", "-c", str(config)])
    assert result.exit_code == 2
    assert "unknown format 'q3'" in result.output
    result = runner.invoke(app, ["model", "forget", "-c", str(config)])
    assert result.exit_code == 0 and "no prepared copy" in result.output

    monkeypatch.setattr(preparing, "PROBES", PROBES)
    monkeypatch.setattr(preparing, "convert", _copied())
    monkeypatch.setattr(preparing, "speed", _timed({"q8_0": Speed(170.0, 100.0)}))
    result = runner.invoke(app, ["model", "prepare", "--format", "q8_0", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "reef serve now loads" in result.output
    result = runner.invoke(app, ["model", "forget", "-c", str(config)])
    assert result.exit_code == 0 and "removed" in result.output
    assert not list((tmp_path / ".reef" / "models").glob("*.gguf"))
