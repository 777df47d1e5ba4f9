"""Upstream Reef's clients against a real `reef serve`: the harness manifest and its releases
(`reef_client.harness_pull`, `harness_versions`, `fetch_skill`, `sync_skill`), a page per release,
`/v1/messages/count_tokens`, the SSE accumulator's receipt, record import (`reef_client`'s
importer and `reef import`, interrupted and resumed), and the `reef_client.serve` sidecar.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI
from reef_client import ReefClient, fetch_skill, sync_skill
from reef_client.record_import import import_records_file
from reef_client.sse import SSEAccumulator

from reef.releases.chain import ReleaseChain
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SMALL_ENGINE, TOKEN

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
BODY_LIMIT = 256 * 1024
SKILL_1 = "---\ndescription: search the code\n---\nUse grep.\n"
SKILL_2 = "---\ndescription: search the code\n---\nUse ripgrep, then read the file.\n"
HOSTILE = "<script>alert('reason')</script> & \"quotes\""
EVALUATION = {
    "current_release_id": "default@1",
    "tasks": 3,
    "current_mean": 0.3333,
    "candidate_mean": 0.6667,
    "wins": 1,
    "losses": 0,
    "ties": 2,
    "lost": [],
    "groups": {},
    "results": [{"task_id": "t1", "prompt": "not listed"}],
    "arms": [],
}
HI = [{"role": "user", "content": "Hi."}]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose chain holds two harness releases: default@1, then default@2 (the gate's
    figures, a new skill text, a notes file only it has, and a reason with markup)."""
    folder = tmp_path_factory.mktemp("upstream-protocol")
    (folder / "reef.yaml").write_text(SMALL_ENGINE + f"server:\n  max_body_bytes: {BODY_LIMIT}\n")
    chain = ReleaseChain(folder / ".reef" / "releases.git")
    first = {"AGENTS.md": b"You are brief.\n", "skills/SKILL.md": SKILL_1.encode()}
    chain.publish("default", "harness", first, None, reason="the first harness")
    second = {
        "AGENTS.md": b"You are brief.\n",
        "skills/SKILL.md": SKILL_2.encode(),
        "NOTES.md": b"</pre><b>not bold</b>\n",
    }
    chain.publish("default", "harness", second, "default@1", evaluation=EVALUATION, reason=HOSTILE)
    return folder


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[ServerProcess]:
    with reef_serve(project, free_port(), env={"REEF_TOKEN": TOKEN}).start() as running:
        yield running


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as session:
        yield session


def records_of(http: httpx.Client, scenario: str) -> list[dict[str, Any]]:
    """Every record of `scenario`, oldest first."""
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"scenario": scenario, "limit": 500}
    while True:
        page = http.get("/reef/records", params=params).json()
        found.extend(page["data"])
        if not page["has_more"] or not page["data"]:
            return found
        params["after"] = page["data"][-1]["id"]


def error_of(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


# -- the harness ------------------------------------------------------------------------------


def test_harness_pull_versions_and_an_older_version(server: ServerProcess, tmp_path: Path) -> None:
    client = ReefClient(server.url, token=TOKEN)
    tree = tmp_path / "tree"
    assert client.harness_pull("default", tree) == "default@2"
    assert (tree / "skills/SKILL.md").read_text() == SKILL_2
    assert (tree / "NOTES.md").exists()

    base, *versions = client.harness_versions("default")
    assert base["release_id"] == "base" and base["operation"] == "start"  # where it started
    assert [v["release_id"] for v in versions] == ["default@1", "default@2"]  # newest last
    assert [v["artifact_version"] for v in versions] == ["default@1", "default@2"]
    assert versions[0]["gate"] is None  # published without an evaluation
    gate = versions[1]["gate"]
    assert gate["candidate_mean"] == 0.6667 and gate["wins"] == 1 and gate["tasks"] == 3
    assert "results" not in gate  # the figures, not each task's answers
    assert versions[1]["serving"] and versions[1]["head"] and not versions[0]["serving"]
    assert versions[1]["parent_release_id"] == "default@1"

    assert client.harness_pull("default", tree, version="default@1") == "default@1"
    assert (tree / "skills/SKILL.md").read_text() == SKILL_1
    assert not (tree / "NOTES.md").exists()  # the newer release's file is gone
    assert json.loads((tree / ".reef-harness-version").read_text())["artifact_version"] == (
        "default@1"
    )


def test_the_manifest_has_upstream_fields_and_a_release_header(http: httpx.Client) -> None:
    response = http.get("/reef/harness", headers={"x-reef-scenario": "default"})
    assert response.status_code == 200, response.text
    manifest = response.json()
    assert response.headers["x-reef-release-id"] == manifest["release_id"] == "default@2"
    assert manifest["artifact_version"] == "default@2"
    assert manifest["parent_release_id"] == "default@1"
    assert len(manifest["content_id"]) == 64 and manifest["requires"] == []
    assert manifest["gate"]["current_release_id"] == "default@1"
    assert "You are brief." in manifest["system_prompt"]

    old = http.get("/reef/harness", params={"release_id": "default@1"})
    assert old.status_code == 200 and old.headers["x-reef-release-id"] == "default@1"
    assert old.json()["files"]["skills/SKILL.md"] == SKILL_1
    assert not old.json()["serving"] and "You are brief." in old.json()["system_prompt"]
    assert http.get("/reef/harness", params={"version": "1"}).json()["release_id"] == "default@1"

    releases = http.get("/reef/harness/releases", headers={"x-reef-scenario": "default"}).json()
    assert releases["scenario"] == "default"
    assert [r["release_id"] for r in releases["releases"]] == ["base", "default@1", "default@2"]

    # A scenario without releases serves the base: no files, and says so.
    empty = http.get("/reef/harness", headers={"x-reef-scenario": "nothing-yet"})
    assert empty.status_code == 200 and empty.headers["x-reef-release-id"] == "base"
    assert empty.json()["files"] == {} and empty.json()["gate"] is None
    versions = http.get("/reef/harness/versions", headers={"x-reef-scenario": "nothing-yet"})
    (start,) = versions.json()["versions"]  # its starting point, as upstream's catalog lists it
    assert start["release_id"] == "base" and start["serving"] and start["head"]


def test_a_fresh_scenario_lists_and_pulls_its_starting_point(
    server: ServerProcess, tmp_path: Path
) -> None:
    """reef-client on a scenario with no release yet: one version, the base, pulled as an
    empty tree (the sidecar says which version it is)."""
    client = ReefClient(server.url, token=TOKEN)
    (start,) = client.harness_versions("fresh")
    assert start["artifact_version"] == "base" and start["version"] == 0
    tree = tmp_path / "fresh"
    assert client.harness_pull("fresh", tree) == "base"
    assert client.harness_pull("fresh", tree, version="base") == "base"
    sidecar = json.loads((tree / ".reef-harness-version").read_text())
    assert sidecar == {"artifact_version": "base", "files": []}


def test_bad_harness_requests_say_what_to_fix(http: httpx.Client) -> None:
    both = http.get(
        "/reef/harness", params={"scenario": "default"}, headers={"x-reef-scenario": "other"}
    )
    assert both.status_code == 400
    assert "'other'" in error_of(both) and "'default'" in error_of(both)
    unknown = http.get("/reef/harness", params={"release_id": "default@9"})
    assert unknown.status_code == 404 and "reef release list" in error_of(unknown)
    malformed = http.get("/reef/harness", params={"release_id": "latest"})
    assert malformed.status_code == 404 and "default@3" in error_of(malformed)
    elsewhere = http.get("/reef/harness", params={"release_id": "staging@1"})
    assert elsewhere.status_code == 404 and "x-reef-scenario: staging" in error_of(elsewhere)
    differ = http.get("/reef/harness", params={"release_id": "default@1", "version": "default@2"})
    assert differ.status_code == 400 and "different releases" in error_of(differ)
    bad_name = http.get("/reef/harness/versions", headers={"x-reef-scenario": "no spaces"})
    assert bad_name.status_code == 400 and "x-reef-scenario" in error_of(bad_name)
    page = http.get("/reef/harness/releases/default@7/page")
    assert page.status_code == 404 and "reef release list" in error_of(page)


def test_fetch_skill_and_sync_skill(server: ServerProcess, tmp_path: Path) -> None:
    text, version = fetch_skill(server.url, "default", TOKEN)
    assert (text, version) == (SKILL_2, "default@2")
    out = tmp_path / "skills" / "SKILL.md"
    assert sync_skill(server.url, "default", out, TOKEN) == ("default@2", True)
    assert out.read_text() == SKILL_2
    assert sync_skill(server.url, "default", out, TOKEN) == ("default@2", False)


def test_a_release_page_says_why_what_and_the_verdict_all_escaped(http: httpx.Client) -> None:
    response = http.get("/reef/harness/releases/default@2/page")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    for section in ("<h2>Why</h2>", "<h2>What changed</h2>", "<h2>Verdict</h2>", "<h2>Chain</h2>"):
        assert section in page
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert "<b>not bold</b>" not in page and "&lt;b&gt;not bold" in page  # the diff, escaped
    assert "0.3333 → 0.6667" in page and "serving now" in page
    assert 'href="/reef/harness/releases/default@1/page"' in page
    data = page.split('<script type="application/json" id="release">')[1].split("</script>")[0]
    assert "<" not in data and json.loads(data)["reason"] == HOSTILE
    # A number is the scenario's release of that number.
    numbered = http.get("/reef/harness/releases/1/page", headers={"x-reef-scenario": "default"})
    assert numbered.status_code == 200 and "next: <a" in numbered.text


# -- count_tokens -----------------------------------------------------------------------------


def test_count_tokens_counts_what_the_model_reads(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key=TOKEN, max_retries=0)
    asked: dict[str, Any] = {
        "model": "default",
        "system": "Answer in one word.",
        "messages": [{"role": "user", "content": "Name a colour."}],
    }
    counted = client.messages.count_tokens(**asked)
    served = client.messages.create(max_tokens=1, **asked)
    # The same prompt the call read: the harness, the system text, the chat template.
    assert counted.input_tokens == served.usage.input_tokens > 10
    alone = client.messages.count_tokens(model="default", messages=asked["messages"])
    assert alone.input_tokens < counted.input_tokens

    for body, says in (
        ({"model": "default"}, "messages"),
        ({"messages": asked["messages"], "max_tokens": 5}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "content"),
    ):
        refused = httpx.post(
            f"{server.url}/v1/messages/count_tokens", json=body, headers={"x-api-key": TOKEN}
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["type"] == "error" and says in refused.json()["error"]["message"]
    wrong = httpx.post(f"{server.url}/v1/messages/count_tokens", json=asked)
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"


# -- the SSE accumulator and the sidecar ------------------------------------------------------


def test_the_sse_accumulator_finds_reefs_receipt(server: ServerProcess, http: httpx.Client) -> None:
    accumulator = SSEAccumulator()
    body = {"messages": HI, "max_tokens": 4, "stream": True, "seed": 1}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            accumulator.feed(chunk)
    accumulator.finish()
    assert accumulator.done and accumulator.agent_record_id
    record = http.get(f"/reef/records/{accumulator.agent_record_id}").json()
    completion = accumulator.completion
    assert completion is not None
    content = completion["choices"][0]["message"]["content"]
    assert content == record["response"]["choices"][0]["message"]["content"]


@pytest.fixture
def sidecar(server: ServerProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    args = [sys.executable, "-m", "reef_client.serve", "--listen", str(port)]
    process = ServerProcess([*args, "--upstream", server.url], port, tmp_path)
    with process.start(timeout=30):  # its /healthz is Reef's, relayed
        yield process


def test_the_sidecar_relays_calls_with_their_receipts(
    sidecar: ServerProcess, http: httpx.Client
) -> None:
    client = OpenAI(base_url=sidecar.url + "/v1", api_key=TOKEN, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="default", messages=HI, max_tokens=4, extra_headers={"x-reef-session": "side-1"}
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    stream = client.chat.completions.create(model="default", messages=HI, max_tokens=4, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    turns = httpx.get(f"{sidecar.url}/_captures").json()["turns"]
    assert [turn["receipt"] is not None for turn in turns] == [True, True]
    assert turns[0]["receipt"] == receipt and turns[1]["client_stream"]
    stored = http.get(f"/reef/records/{receipt}").json()
    assert stored["session"] == "side-1"
    streamed_record = http.get(f"/reef/records/{turns[1]['receipt']}").json()
    assert streamed_record["response"]["choices"][0]["message"]["content"] == streamed


# -- record import ----------------------------------------------------------------------------


def envelopes(count: int, prefix: str = "imp") -> list[dict[str, Any]]:
    """`count` inference records, each third one scored by a report after it."""
    lines: list[dict[str, Any]] = []
    for n in range(count):
        lines.append(
            {
                "agent_record_id": f"{prefix}-{n}",
                "request_type": "inference",
                "session": f"s-{n // 4}",
                "payload": {
                    "messages": [{"role": "user", "content": f"What is {n} + 1?"}],
                    "response": {"choices": [{"message": {"content": str(n + 1)}}]},
                },
                **({"metadata": {"source": "legacy"}} if n == 0 else {}),
            }
        )
    return lines


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_reef_client_import_is_idempotent(
    server: ServerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    lines = envelopes(30)
    lines.append(
        {
            "agent_record_id": "score-1",
            "request_type": "report",
            "payload": {"references": ["imp-1"], "score": 1, "feedback": "right"},
        }
    )
    source = write_jsonl(tmp_path / "records.jsonl", lines)
    options: dict[str, Any] = {"url": server.url, "scenario": "client-import", "token": TOKEN}
    assert import_records_file(source, batch_size=7, **options) == 31
    # The checkpoint gone, everything is sent again: acknowledged, not stored twice.
    (tmp_path / "records.jsonl.reef-import.json").unlink()
    assert import_records_file(source, batch_size=31, **options) == 31

    stored = records_of(http, "client-import")
    assert [r["id"] for r in stored] == [f"imp-{n}" for n in range(30)]
    first = stored[1]
    assert first["engine"] == "import" and first["release_id"] == "base"
    assert first["session"] == "s-0" and first["response"]["object"] == "chat.completion"
    assert first["response"]["choices"][0]["message"] == {"role": "assistant", "content": "2"}
    assert [(r["id"], r["score"]) for r in first["reports"]] == [("score-1", 1)]
    assert stored[0]["annotations"][0]["source"] == "import"
    assert stored[0]["annotations"][0]["metadata"] == {"source": "legacy"}


def test_bad_imports_are_4xx_that_say_what_to_fix_and_store_nothing(
    http: httpx.Client,
) -> None:
    scenario = {"x-reef-scenario": "bad-import"}
    good = envelopes(2, prefix="bad")
    cases: list[tuple[Any, int, str]] = [
        ({"records": []}, 400, "non-empty list"),
        ({"items": good}, 400, "unknown key"),
        ({"records": [{**good[0], "agent_record_id": "has space"}, good[1]]}, 400, "records[0]"),
        ({"records": [good[0], {**good[1], "request_type": "train"}]}, 400, "inference, report"),
        ({"records": [{k: v for k, v in good[0].items() if k != "payload"}]}, 400, "payload"),
        ({"records": [{**good[0], "payload": {"messages": HI}}]}, 400, "payload.response"),
        ({"records": [{**good[0], "scenario": "elsewhere"}]}, 400, "x-reef-scenario"),
        ({"records": [good[0], {**good[0], "session": "other"}]}, 400, "twice"),
        (
            {
                "records": [
                    good[0],
                    {
                        "agent_record_id": "r-1",
                        "request_type": "report",
                        "payload": {"references": ["nowhere"], "score": 1},
                    },
                ]
            },
            404,
            "import the records before the reports",
        ),
        ({"records": [good[0]] * 1001}, 400, "at most 1000"),
        (
            {"records": [{**good[0], "payload": {**good[0]["payload"], "x": "y" * BODY_LIMIT}}]},
            413,
            "fewer records per request",
        ),
    ]
    for body, status, says in cases:
        response = http.post("/reef/records/batch", json=body, headers=scenario)
        assert response.status_code == status, (body if status != 413 else "", response.text)
        assert says in error_of(response), response.text
    assert records_of(http, "bad-import") == []

    assert (
        http.post("/reef/records/batch", json={"records": good}, headers=scenario).json()[
            "imported"
        ]
        == 2
    )
    changed = {**good[0], "payload": {**good[0]["payload"], "messages": HI}}
    conflict = http.post("/reef/records/batch", json={"records": [changed]}, headers=scenario)
    assert conflict.status_code == 409 and "new agent_record_id" in error_of(conflict)
    again = http.post("/reef/records/batch", json={"records": good}, headers=scenario).json()
    assert (again["imported"], again["duplicates"]) == (0, 2)
    assert len(records_of(http, "bad-import")) == 2


def reef_import(server: ServerProcess, cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REEF_TOKEN": TOKEN, "REEF_URL": server.url}
    return subprocess.Popen(
        [sys.executable, "-m", "reef", "import", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_reef_import_resumes_after_an_interruption_without_duplicates(
    server: ServerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    lines = envelopes(1000, prefix="cli")
    whole = write_jsonl(tmp_path / "all.jsonl", lines)
    prefix = write_jsonl(tmp_path / "prefix.jsonl", lines[:300])
    scenario = ("--scenario", "cli-import")

    done = reef_import(server, tmp_path, str(prefix), *scenario)
    output, _ = done.communicate(timeout=120)
    assert done.returncode == 0, output
    assert "300 stored now, 0 already there" in output
    assert len(records_of(http, "cli-import")) == 300

    # One record a request, killed part of the way through.
    running = reef_import(server, tmp_path, str(whole), *scenario, "--batch-size", "1")
    checkpoint = tmp_path / "all.jsonl.reef-import.json"
    deadline = time.monotonic() + 120
    while running.poll() is None and time.monotonic() < deadline:
        if checkpoint.exists() and json.loads(checkpoint.read_text() or "{}").get("records", 0):
            break
        time.sleep(0.01)
    running.send_signal(signal.SIGKILL)
    running.communicate(timeout=30)
    acknowledged = json.loads(checkpoint.read_text())["records"]
    assert 0 < acknowledged < 1000  # a thousand requests take seconds: it was stopped early

    rerun = reef_import(server, tmp_path, str(whole), *scenario, "--batch-size", "100")
    output, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, output
    assert f"({acknowledged} records acknowledged before)" in output
    stored = records_of(http, "cli-import")
    assert sorted(r["id"] for r in stored) == sorted(f"cli-{n}" for n in range(1000))

    finished = reef_import(server, tmp_path, str(whole), *scenario)
    output, _ = finished.communicate(timeout=60)
    assert finished.returncode == 0 and "imported already (1000 records)" in output
    broken = write_jsonl(tmp_path / "broken.jsonl", lines[:2])
    broken.write_text(broken.read_text() + "{not json\n")
    failed = reef_import(server, tmp_path, str(broken), *scenario)
    output, _ = failed.communicate(timeout=60)
    assert failed.returncode == 1 and "broken.jsonl:3 is not JSON" in output
    assert len(records_of(http, "cli-import")) == 1000
