"""An episode's token has a budget of calls and request bytes on the server, outside the
sandbox's cgroup (issue 74: 12 calls of 30 MiB grew experience.db by 391 MiB in 17 s). Past
either, 429 with a JSON error naming the setting, and nothing of the refused call is stored.
Real HTTP to Reef served in the test's process (a scripted engine), real SQLite."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from reef.episodes.tokens import EpisodeGrant, mint
from reef.testing.in_process import reef_in_process

TOKEN = "budget-token"


def chat(url: str, token: str, words: int = 1) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi " * words}]}
    return httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def records(url: str) -> int:
    page = httpx.get(f"{url}/reef/records?limit=1000", headers={"authorization": f"Bearer {TOKEN}"})
    return len(page.json()["data"])


def test_an_episode_past_its_calls_or_bytes_is_refused_and_nothing_stored(
    tmp_path: Path,
) -> None:
    (tmp_path / "reef.yaml").write_text("episodes:\n  token_calls: 3\n  token_bytes: 4096\n")
    with reef_in_process(tmp_path, env={"REEF_TOKEN": TOKEN}) as server:
        calls = mint(EpisodeGrant("default", "ep-calls", "t", "base", time.time() + 60), TOKEN)
        answered = [chat(server.url, calls).status_code for _ in range(4)]
        stored = records(server.url)
        bytes_token = mint(
            EpisodeGrant("default", "ep-bytes", "t", "base", time.time() + 60), TOKEN
        )
        small = chat(server.url, bytes_token, words=100)  # ~400 bytes
        large = chat(server.url, bytes_token, words=2000)  # ~6,000 bytes: past 4,096 in all
        after = records(server.url)
        other = chat(
            server.url, mint(EpisodeGrant("default", "ep-3", "t", "base", time.time() + 60), TOKEN)
        )
    assert answered == [200, 200, 200, 429]
    assert stored == 3
    assert small.status_code == 200 and large.status_code == 429
    error = large.json()["error"]
    assert error["code"] == "episode_budget" and "episodes.token_bytes" in error["message"]
    assert after == 4  # the refused calls left nothing
    assert other.status_code == 200  # a budget is one episode's
