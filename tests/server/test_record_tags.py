"""`x-reef-tag-<name>` headers tag a call's record: stored with it (`metadata.tags`), listed by
`GET /reef/records?tag=name:value` and `reef records --tag`, found by the review's search; a tag
that breaks the rules is a 400 that names it, and stores nothing. And records found by their
words: `GET /reef/records?search=` and `reef records --search`, with tags or without."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from reef.review.queries import record_rows
from reef.store import ExperienceStore
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import write_config

CHAT = "/v1/chat/completions"


def ask(server: ServerProcess, text: str, **tags: str) -> str:
    headers = {f"x-reef-tag-{name}": value for name, value in tags.items()}
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    answer = httpx.post(server.url + CHAT, json=body, headers=headers, timeout=60)
    answer.raise_for_status()
    return answer.headers["x-reef-agent-record-id"]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, peer: ServerProcess
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("tags")
    write_config(folder, f"engine:\n  kind: upstream\n  upstream:\n    url: {peer.url}/v1\n")
    with reef_serve(folder, free_port()).start() as running:
        yield running


def test_tags_are_stored_with_the_record_and_filter_the_list(server: ServerProcess) -> None:
    alice = ask(server, "one", user="alice", team="blue")
    bob = ask(server, "two", user="bob", team="blue")
    plain = ask(server, "three")

    record = httpx.get(f"{server.url}/reef/records/{alice}").json()
    assert record["metadata"] == {"tags": {"user": "alice", "team": "blue"}}
    untagged = httpx.get(f"{server.url}/reef/records/{plain}").json()
    assert untagged["metadata"] == {"tags": {}}

    def listed(*tags: str, order: str = "asc") -> list[str]:
        params = [("tag", tag) for tag in tags] + [("order", order), ("limit", "100")]
        found = httpx.get(f"{server.url}/reef/records", params=params).json()["data"]
        return [row["id"] for row in found]

    assert listed("team:blue") == [alice, bob]
    assert listed("team:blue", "user:bob") == [bob]  # every tag given
    assert listed("user:carol") == []
    assert listed("team:blue", order="desc") == [bob, alice]

    shown = run_reef(server.cwd, "records", "--tag", "user:alice", "--json", "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    assert '"alice"' in shown.stdout and bob not in shown.stdout

    with ExperienceStore(server.cwd / ".reef" / "experience.db") as store:
        found = [row.id for row in record_rows(store, search="alice")]
    assert found == [alice]


def test_records_are_found_by_the_words_asked_or_answered(server: ServerProcess) -> None:
    lighthouse = ask(server, "Tell me about the old lighthouse keeper", user="dana")
    ask(server, "Tell me about the river", user="dana")

    def searched(**params: str) -> list[str]:
        found = httpx.get(f"{server.url}/reef/records", params=params).json()["data"]
        return [row["id"] for row in found]

    assert searched(search="lighthouse keeper") == [lighthouse]  # every word, asked or answered
    assert searched(search="lighthouse", order="desc", tag="user:dana") == [lighthouse]
    assert searched(search="lighthouse", tag="user:bob") == []
    assert searched(search="submarine") == []
    too_long = httpx.get(f"{server.url}/reef/records", params={"search": "x" * 501})
    assert too_long.status_code == 400 and "at most 500" in too_long.json()["error"]["message"]

    shown = run_reef(server.cwd, "records", "--search", "keeper", "--json", "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    assert lighthouse in shown.stdout and "river" not in shown.stdout


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"x-reef-tag-a+b": "x"}, "a tag's name is"),
        ({"x-reef-tag-user": "x" * 257}, "at most 256 characters"),
        ({f"x-reef-tag-t{n}": "x" for n in range(17)}, "at most 16 x-reef-tag-* headers"),
    ],
)
def test_a_tag_that_breaks_the_rules_is_a_400_and_stores_nothing(
    server: ServerProcess, headers: dict[str, str], message: str
) -> None:
    before = httpx.get(f"{server.url}/reef/records", params={"limit": 1000}).json()["data"]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(server.url + CHAT, json=body, headers=headers, timeout=60)
    assert refused.status_code == 400
    assert message in refused.json()["error"]["message"]
    after = httpx.get(f"{server.url}/reef/records", params={"limit": 1000}).json()["data"]
    assert len(after) == len(before)


def test_a_tag_filter_that_is_not_name_colon_value_is_a_400(server: ServerProcess) -> None:
    refused = httpx.get(f"{server.url}/reef/records", params={"tag": "alice"})
    assert refused.status_code == 400 and "name:value" in refused.json()["error"]["message"]
