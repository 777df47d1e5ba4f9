"""`reef review` on a real project's stores, driven by keys through Textual's pilot."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static, TabbedContent

from reef.config import load_config
from reef.review.local_source import LocalSource
from reef.store import ExperienceStore
from reef.store.shadows import ShadowRecord, add_shadow
from reef.testing.processes import run_reef
from reef.tui.app import ReviewApp
from reef.tui.screens.candidate_screen import CandidateScreen, TaskBlock
from reef.tui.screens.dialogs import ConfirmDialog, TextDialog
from reef.tui.screens.help import HelpScreen
from reef.tui.screens.record_screen import RecordScreen
from reef.tui.widgets.diff_view import DiffView
from reef.tui.widgets.keyed_table import KeyedTable
from tests.review.test_review_project import candidates_by_reason, head, project

__all__ = ["project"]  # the fixture, shared with test_review_project
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def until(pilot: Pilot[None], condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        app = pilot.app
        seen = [f"{n.title}: {n.message}" for n in app._notifications]
        assert time.monotonic() < deadline, (
            f"timed out on {app.screen!r}, focus on {app.focused!r}, "
            f"tab {app.query_one(TabbedContent).active!r}; notes: {seen}"
        )
        await pilot.pause(0.05)


@asynccontextmanager
async def review(
    project: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int] = (100, 30)
) -> AsyncIterator[tuple[ReviewApp, Pilot[None]]]:
    monkeypatch.chdir(project)
    source = LocalSource(load_config(None))
    app = ReviewApp(source, poll_s=0.2)
    try:
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.polls > 0 and app.access is not None)
            # Keys go where a person's would: to the first tab's table, once it has focus
            # (before that, the first focusable widget, the filter, would take typed keys).
            await until(pilot, lambda: isinstance(app.focused, KeyedTable))
            yield app, pilot
    finally:
        source.close()


async def switch_tab(pilot: Pilot[None], key: str, tab: str) -> None:
    """Press a tab's key until its tab is active. Known race, kept visible here: a key pressed
    just after start-up can be undone by the first tab taking focus late (Textual's
    TabbedContent switches to the tab that holds the focus)."""
    app = pilot.app
    for _ in range(3):
        await pilot.press(key)
        with contextlib.suppress(AssertionError):
            await until(pilot, lambda: app.query_one(TabbedContent).active == tab, timeout=3)
            return
    raise AssertionError(f"key {key!r} did not show the {tab} tab")


def table(app: ReviewApp, name: str) -> KeyedTable:
    return app.query_one(f"#{name}-table", KeyedTable)


def notes(app: ReviewApp) -> str:
    return "\n".join(f"{n.title}: {n.message}" for n in app._notifications)


async def test_candidates_held_first_with_full_ids_and_scores(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {reason: row["id"] for reason, row in candidates_by_reason(project).items()}
    async with review(project, monkeypatch) as (app, _):
        rows = table(app, "candidates")
        assert rows.ordered_keys() == [
            ids["held harness"],
            ids["loser harness"],
            ids["winner harness"],
        ]
        winner = rows.get_row(ids["winner harness"])
        assert winner[0] == ids["winner harness"]  # the whole id, to copy
        assert str(winner[1]) == "released" and str(winner[8]) == "+1.00"
        assert str(rows.get_row(ids["loser harness"])[8]) == "-1.00"


async def test_a_poll_while_the_panes_are_coming_down_does_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll interval can fire while the app is being taken down (CI saw it once, on leaving
    `run_test`): a poll then finds no pane, and must neither raise nor start a fetch."""
    async with review(project, monkeypatch) as (app, pilot):
        await until(pilot, lambda: not app._polling)
        await app.query_one("#tabs", TabbedContent).remove()
        await until(pilot, lambda: not app._polling)  # one the interval began during the removal
        polls = app.polls
        app.poll()
        assert not app._polling
        await pilot.pause(0.5)  # intervals fire meanwhile, on no panes
        assert app.polls == polls


async def test_approve_key_releases_the_held_candidate_and_moves_the_head(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = candidates_by_reason(project)["held harness"]["id"]
    async with review(project, monkeypatch) as (app, pilot):
        assert table(app, "candidates").selected_key == held
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        consequence = str(app.screen.query_one("#consequence", Static).render())
        assert f"default will serve {held}" in consequence and "default@1" in consequence
        await pilot.press("y")
        await until(pilot, lambda: head(project) == "default@2")
        await until(pilot, lambda: str(table(app, "candidates").get_row(held)[1]) == "released")
        assert "released as default@2" in notes(app)
    assert candidates_by_reason(project)["held harness"]["state"] == "released"


async def test_reject_records_the_typed_reason(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch) as (app, pilot):
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, TextDialog))
        await pilot.press(*"too verbose", "enter")
        await until(pilot, lambda: "is rejected" in notes(app))
    held = candidates_by_reason(project)["held harness"]
    assert held["state"] == "rejected"
    assert held["decision"] == "rejected by a human: too verbose"
    assert head(project) == "default@1"


async def test_canary_key_puts_the_held_candidate_on_a_share_and_shows_it_live(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = candidates_by_reason(project)["held harness"]["id"]
    async with review(project, monkeypatch) as (app, pilot):
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, TextDialog))
        await pilot.press("backspace", "backspace", *"25", "enter")
        await until(pilot, lambda: head(project) == "default@2")
        await until(pilot, lambda: str(table(app, "candidates").get_row(held)[1]) == "canary")
        assert f"{held} serves 25% of default's sessions (default@2)" in notes(app)
        summary = lambda: str(app.query_one("#candidate-summary").render())  # noqa: E731
        await until(pilot, lambda: "canary: stable - on 0 report(s)" in summary())
        assert "next: it waits for more reports" in summary()
        await pilot.press("a")  # on a canary: promote it now
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: head(project) == "default@3")
    promoted = candidates_by_reason(project)["held harness"]
    assert promoted["state"] == "released"


async def test_shadow_key_and_the_shadow_answers_beside_the_live_ones(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = candidates_by_reason(project)["held harness"]["id"]
    async with review(project, monkeypatch) as (app, pilot):
        await pilot.press("h")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: str(table(app, "candidates").get_row(held)[1]) == "shadow")
        with ExperienceStore(project / ".reef/experience.db") as store:
            live = store.query("SELECT id, response FROM records LIMIT 1")[0]
            answer = {"choices": [{"message": {"role": "assistant", "content": "Bonjour."}}]}
            add_shadow(
                store,
                ShadowRecord("default", held, live["id"], answer, live_score=0.0, shadow_score=1.0),
            )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CandidateScreen))
        await until(pilot, lambda: bool(app.screen.query("#shadows TaskBlock")))
        (pair,) = app.screen.query("#shadows TaskBlock")
        assert isinstance(pair, TaskBlock) and pair.sides == ("live", "shadow")
        # The detail tabs, from the keyboard wherever the focus is: `]` next, `[` previous.
        tabs = app.screen.query_one("#candidate-tabs", TabbedContent)
        first = tabs.active
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: tabs.active != first)
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: tabs.active == first)
        assert pair.result.task_id == live["id"] and pair.result.candidate_answer == "Bonjour."
        assert (pair.result.current_score, pair.result.candidate_score) == (0.0, 1.0)


async def test_a_head_moved_by_another_process_is_a_conflict_not_a_crash(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch) as (app, pilot):
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        moved = run_reef(project, "release", "promote", "default@1")  # another process
        assert moved.returncode == 0, moved.stderr
        await pilot.press("y")
        await until(pilot, lambda: "conflict" in notes(app))
        assert "default@2" in notes(app) and "Nothing was changed" in notes(app)
        assert app.is_running
    assert head(project) == "default@2"  # the promotion, nothing on top of it
    assert candidates_by_reason(project)["held harness"]["state"] == "held"


async def test_rows_update_in_place_and_the_cursor_stays_on_its_row(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {reason: row["id"] for reason, row in candidates_by_reason(project).items()}
    async with review(project, monkeypatch) as (app, pilot):
        rows = table(app, "candidates")
        await pilot.press("down")
        assert rows.selected_key == ids["loser harness"]
        rejected = run_reef(project, "release", "reject", ids["held harness"], "--reason", "no")
        assert rejected.returncode == 0, rejected.stderr
        await until(pilot, lambda: str(rows.get_row(ids["held harness"])[1]) == "rejected")
        assert rows.ordered_keys() == [ids[f"{r} harness"] for r in ("held", "loser", "winner")]
        assert rows.selected_key == ids["loser harness"]


async def test_candidate_detail_shows_the_paired_evaluation_and_the_diff(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch) as (app, pilot):
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CandidateScreen))
        await until(pilot, lambda: bool(app.screen.query(TaskBlock)))
        (block,) = app.screen.query(TaskBlock)
        assert block.result.prompt == "Say hello." and block.result.current_score == 1.0
        diff = str(app.screen.query_one("#diff-text", Static).render())
        assert "+You are held for review." in diff and "-You are terse." in diff
        await pilot.press("escape")
        assert not isinstance(app.screen, CandidateScreen)


async def test_releases_diff_and_promote_into_another_scenario(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch) as (app, pilot):
        await switch_tab(pilot, "3", "releases")
        await until(pilot, lambda: table(app, "releases").ordered_keys() == ["default@1"])
        await until(pilot, lambda: app.focused is table(app, "releases"))
        assert "serving" in str(table(app, "releases").get_row("default@1")[1])
        await pilot.press("enter")
        await until(
            pilot,
            lambda: (
                "You are terse" in str(app.screen.query_one(DiffView).query_one(Static).render())
            ),
        )
        await pilot.press("escape", "p")
        await until(pilot, lambda: isinstance(app.screen, TextDialog))
        app.screen.query_one(Input).value = ""
        await pilot.press(*"staging", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "staging will serve a copy of default@1" in str(
            app.screen.query_one("#consequence", Static).render()
        )
        await pilot.press("y")
        await until(pilot, lambda: head(project, "staging") == "staging@1")
        await until(pilot, lambda: "staging@1" in table(app, "releases").ordered_keys())


async def test_records_search_and_open_with_feedback(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch) as (app, pilot):
        await switch_tab(pilot, "4", "records")
        await until(pilot, lambda: len(table(app, "records").ordered_keys()) == 2)
        await pilot.press("slash", *"colours", "enter")
        await until(pilot, lambda: len(table(app, "records").ordered_keys()) == 1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RecordScreen))
        text = lambda: str(app.screen.query_one("#record-text", Static).render())  # noqa: E731
        await until(pilot, lambda: "scored 1" in text())
        assert "Name three colours." in text() and "Red, green, blue." in text()


async def test_scenarios_help_palette_and_a_small_terminal(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with review(project, monkeypatch, size=(80, 24)) as (app, pilot):
        await switch_tab(pilot, "2", "scenarios")
        await until(pilot, lambda: table(app, "scenarios").ordered_keys() == ["default"])
        row = table(app, "scenarios").get_row("default")
        assert row[1:6] == ["default@1", "default@1", "2", "2", "1/2 50% [9%-91%]"]
        # Is it learning: each release's live pass rate, with its interval.
        progress = app.query_one("#releases-progress", KeyedTable)
        assert progress.get_row("default/default@1")[1:4] == ["default@1", "2", "1/2 50% [9%-91%]"]
        assert app.query_one("#curve-default")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert {"Approve candidate", "Reject candidate", "Roll back", "Promote release"} <= set(
            titles
        )
        await pilot.press("q")
    assert not app.is_running


async def test_a_lora_candidate_shows_its_weights_and_training_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA candidate as the sft recipe proposes one: adapter files and the loss per step."""
    from reef.releases.chain import read_folder
    from reef.releases.workflow import ReleaseWorkflow
    from reef.store import ExperienceStore
    from reef.testing.artifacts import random_lora

    (tmp_path / "reef.yaml").write_text("gate:\n  policy: review\n")
    config = load_config(tmp_path / "reef.yaml")
    adapter = random_lora(tmp_path / "lora")
    with ExperienceStore(config.experience_db) as store:
        ReleaseWorkflow(config, store).propose(
            "default",
            "lora",
            read_folder(adapter),
            source="sft",
            reason="LoRA r8 on 6 examples",
            metrics={"loss": [2.5, 1.75, 1.0]},
        )
    async with review(tmp_path, monkeypatch) as (app, pilot):
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CandidateScreen))
        weights = app.screen.query_one("#weights-table", KeyedTable)
        await until(pilot, lambda: weights.row_count > 0)
        size = (adapter / "adapter.gguf").stat().st_size
        assert [str(c) for c in weights.get_row_at(0)[:2]] == ["adapter.gguf", str(size)]
        label = str(app.screen.query_one("#loss-label").render())
        assert "2.500 → 1.000" in label
