"""The llm proposer on the embedded model: constrained decoding makes every reply a mutation.

Without a grammar, the 135M model never wrote a parseable mutation (every step ended "no
proposal"). With the mutation's JSON schema enforced by llama.cpp, every reply parses into a
mutation of a file the proposer may write: the step proposes a candidate for the gate, unless
the change it parsed into is one the tree refuses (a file written as it already was, whitespace
for content, a removal of a file that is not there), which depends on what the model sampled.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.engines.llamacpp.structured import output_constraint
from reef.protocol import ChatRequest
from reef.recipes.harness_evolve.mutations import apply, parse_mutation
from reef.recipes.harness_evolve.proposers import fitted, mutation_schema, reply_room
from reef.testing.processes import free_port, reef_serve
from tests.conftest import SMALL_ENGINE, write_config

CONFIG = (
    SMALL_ENGINE
    + "gate:\n  max_tokens: 16\n"
    + "learning:\n  recipe: harness_evolve\n  mode: manual\n  proposer: llm\n  batch_size: 1\n"
)


@pytest.mark.e2e
def test_every_llm_proposal_parses_and_reaches_the_gate(tmp_path: Path) -> None:
    write_config(tmp_path, CONFIG)
    (tmp_path / "evals").mkdir()
    task = {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "scorer": {"type": "contains", "value": "blue"},
    }
    (tmp_path / "evals/default.jsonl").write_text(json.dumps(task) + "\n")
    with reef_serve(tmp_path, free_port()).start() as server:
        body = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 16}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        report = {
            "references": [reply.headers["x-reef-agent-record-id"]],
            "score": 0,
            "feedback": "Please answer in one word.",
        }
        httpx.post(f"{server.url}/reef/report", json=report).raise_for_status()
        outcomes = []
        for _ in range(2):
            instruction = {"instruction": "make answers shorter"}
            httpx.post(f"{server.url}/reef/train", json=instruction).raise_for_status()
            deadline = time.monotonic() + 240
            while True:
                learning = httpx.get(f"{server.url}/reef/status").json()["learning"]
                steps = learning["scenarios"].get("default", {}).get("batches_built", 0)
                if steps > len(outcomes):
                    outcomes.append(learning["scenarios"]["default"]["last_step"])
                    break
                assert time.monotonic() < deadline, server.log()[-2000:]
                time.sleep(1)
        refusals = [line for line in server.log().splitlines() if "proposed nothing" in line]
    gated = [o for o in outcomes if o["outcome"] in ("released", "rejected", "held")]
    assert len(gated) + len(refusals) == len(outcomes) == 2, (outcomes, refusals)
    assert all(o["candidate_id"] for o in gated)
    # Every reply parsed: the only refusals are of what a parsed change would do to the tree.
    unparsed = ("no JSON object", "op must be", "must be strings", "outside the harness tree")
    assert not [line for line in refusals if any(reason in line for reason in unparsed)]
    tree_refusals = ("changes nothing", "empty content", "does not exist", "already exists")
    assert all(any(reason in line for reason in tree_refusals) for line in refusals), refusals


def test_every_write_the_schema_allows_fits_the_tree() -> None:
    files = {"AGENTS.md": b"x", "rules/tone.md": b"y", "notes.txt": b"z"}
    schema = mutation_schema(files)
    assert schema["type"] == "object"  # a plain object at the top, as OpenAI's strict mode wants
    properties: Any = schema["properties"]
    assert properties["path"]["enum"] == ["AGENTS.md", "rules/feedback.md", "rules/tone.md"]
    assert properties["op"]["enum"] == ["create", "update", "remove"]
    for op in ("create", "update"):  # the model cannot see which files exist: either works
        for path in properties["path"]["enum"]:
            reply = {"op": op, "path": path, "content": "Be brief.", "reason": "asked"}
            mutation = fitted(parse_mutation(json.dumps(reply), max_bytes=8000), files)
            assert apply(files, mutation)[path] == b"Be brief."
    form = {"type": "json_schema", "json_schema": {"name": "mutation", "schema": schema}}
    request = ChatRequest(messages=[{"role": "user", "content": "x"}], response_format=form)
    assert output_constraint(request) is not None  # a grammar llama.cpp can enforce


def test_an_empty_tree_offers_no_removal() -> None:
    properties: Any = mutation_schema({})["properties"]
    assert properties["op"]["enum"] == ["create", "update"]
    assert properties["path"]["enum"] == ["AGENTS.md", "rules/feedback.md"]


def test_the_longest_mutation_fits_in_the_room_the_proposer_asks_for() -> None:
    """A reply cut by max_tokens is not JSON ("no proposal"): CI saw it with 400 tokens."""
    files = {"rules/a-rather-long-rule-name-about-tone.md": b"x"}
    schema = mutation_schema(files)
    properties: Any = schema["properties"]
    longest = {
        "op": max(properties["op"]["enum"], key=len),
        "path": max(properties["path"]["enum"], key=len),
        "content": "c" * properties["content"]["maxLength"],
        "reason": "r" * properties["reason"]["maxLength"],
    }
    assert len(json.dumps(longest)) <= reply_room(schema)  # a token a character, typically
