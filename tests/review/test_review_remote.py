"""`reef review --url`: the same screens over a real `reef serve`, with an admin token and with
an inference-only one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.review.http_source import HttpSource
from reef.testing.processes import ServerProcess, free_port, reef_serve
from reef.tui.app import ReviewApp
from reef.tui.screens.dialogs import ConfirmDialog
from tests.review.test_review_app import notes, table, until
from tests.review.test_review_project import candidates_by_reason, head, project

__all__ = ["project"]
pytestmark = pytest.mark.anyio
ADMIN, USER = "review-admin-7d1e", "review-user-2c9a"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server(project: Path) -> Iterator[ServerProcess]:
    env = {"REEF_ADMIN_TOKEN": ADMIN, "REEF_TOKEN": USER}
    with reef_serve(project, free_port(), env=env).start() as running:
        yield running


async def test_admin_token_approves_through_the_api(server: ServerProcess, project: Path) -> None:
    held = candidates_by_reason(project)["held harness"]["id"]
    source = HttpSource(server.url, ADMIN)
    app = ReviewApp(source, poll_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.polls > 0 and app.access is not None)
        assert app.access is not None and app.access.can_decide
        assert table(app, "candidates").selected_key == held
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("y")
        await until(pilot, lambda: head(project) == "default@2", timeout=30)
        await until(pilot, lambda: "released as default@2" in notes(app))
    source.close()


async def test_an_inference_token_can_look_but_not_decide(
    server: ServerProcess, project: Path
) -> None:
    source = HttpSource(server.url, USER)
    app = ReviewApp(source, poll_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.polls > 0 and app.access is not None)
        assert len(table(app, "candidates").ordered_keys()) == 3
        banner = str(app.query_one("#access-banner").render())
        assert "read-only" in banner and "REEF_ADMIN_TOKEN" in banner
        await pilot.press("a")
        await until(pilot, lambda: "decisions are disabled" in notes(app))
        assert not isinstance(app.screen, ConfirmDialog)
    source.close()
    assert candidates_by_reason(project)["held harness"]["state"] == "held"
    assert head(project) == "default@1"


def test_review_routes_read_with_any_token_and_promote_needs_admin(
    server: ServerProcess, project: Path
) -> None:
    held = candidates_by_reason(project)["held harness"]["id"]
    user = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {USER}"})
    detail = user.get(f"/reef/review/candidates/{held}").json()
    assert detail["tasks"][0]["prompt"] == "Say hello." and "+You are held" in detail["diff"]
    diff = user.get("/reef/review/releases/default@1/diff").json()["diff"]
    assert "+You are terse." in diff
    body = {"release_id": "default@1"}
    assert user.post("/reef/scenarios/staging/promote", json=body).status_code == 403
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    moved = admin.post("/reef/scenarios/staging/promote", json={**body, "expected_head": "x"})
    assert moved.status_code == 409 and head(project, "staging") is None
    assert admin.post("/reef/scenarios/staging/promote", json=body).status_code == 201
    assert head(project, "staging") == "staging@1"
