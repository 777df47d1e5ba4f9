"""The llm proposer on the embedded model: constrained decoding makes every reply a mutation.

Without a grammar, the 135M model never wrote a parseable mutation (every step ended "no
proposal"). With the mutation's JSON schema enforced by llama.cpp, a step always proposes a
candidate, and the gate decides whether it helps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from recipes.harness_evolve.mutations import apply, parse_mutation
from recipes.harness_evolve.proposers import mutation_schema

from reef.engines.base import ChatRequest
from reef.engines.structured import output_constraint
from reef.learning.worker import SCHEMA_REPLY_TOKENS
from reef.testing.processes import free_port, reef_serve
from tests.conftest import SMALL_ENGINE, write_config

CONFIG = (
    SMALL_ENGINE
    + "gate:\n  max_tokens: 16\n"
    + "learning:\n  recipe: harness_evolve\n  mode: manual\n  proposer: llm\n  batch_size: 1\n"
)


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
    assert all(o["outcome"] in ("released", "rejected", "held") for o in outcomes), refusals
    assert all(o["candidate_id"] for o in outcomes)


def test_the_mutation_schema_offers_only_mutations_the_tree_accepts() -> None:
    files = {"AGENTS.md": b"x", "rules/tone.md": b"y", "notes.txt": b"z"}
    schema = mutation_schema(files)
    branches = {tuple(b["properties"]["op"]["enum"]): b for b in schema["anyOf"]}  # type: ignore[attr-defined]
    assert branches[("create",)]["properties"]["path"]["enum"] == ["rules/feedback.md"]
    present = branches[("update", "remove")]["properties"]["path"]["enum"]
    assert present == ["AGENTS.md", "rules/tone.md"]
    for ops, branch in branches.items():
        for op in ops:
            for path in branch["properties"]["path"]["enum"]:
                reply = {"op": op, "path": path, "content": "Be brief.", "reason": "asked"}
                mutation = parse_mutation(json.dumps(reply), max_bytes=8000)
                assert apply(files, mutation) != files  # never refused, always a change
    form = {"type": "json_schema", "json_schema": {"name": "mutation", "schema": schema}}
    request = ChatRequest(messages=[{"role": "user", "content": "x"}], response_format=form)
    assert output_constraint(request) is not None  # a grammar llama.cpp can enforce


def test_an_empty_tree_can_only_create() -> None:
    schema = mutation_schema({})
    assert schema["properties"]["op"]["enum"] == ["create"]  # type: ignore[index]
    assert schema["properties"]["path"]["enum"] == ["AGENTS.md", "rules/feedback.md"]  # type: ignore[index]


def test_the_longest_mutation_fits_in_the_reply_the_worker_allows() -> None:
    """A reply cut by max_tokens is not JSON ("no proposal"): CI saw it with 400 tokens."""
    branch = mutation_schema({})["properties"]
    empty = {"op": "create", "path": "", "content": "", "reason": ""}
    longest = len(json.dumps(empty))  # keys, quotes and braces
    longest += sum(field.get("maxLength", 0) for field in branch.values())  # type: ignore[union-attr]
    longest += max(len(path) for path in branch["path"]["enum"])  # type: ignore[index]
    assert longest <= SCHEMA_REPLY_TOKENS  # a token a character, at worst
