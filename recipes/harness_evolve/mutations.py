"""Harness mutations: one change to one file of the tree, checked before it is applied.

A proposer answers with a mutation; anything that is not one well-formed change inside the tree
(unparseable, empty, oversized, a path outside the tree) is refused with a reason, never applied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from reef.sdk import ProposalRefused

OPS = ("create", "update", "remove")
EDITABLE = re.compile(
    r"^(AGENTS\.md|examples\.jsonl|rules/[a-z0-9_-]+\.md|skills/[a-z0-9_-]+/SKILL\.md)$"
)


class MutationRefused(ProposalRefused):
    """The proposal is not a usable mutation; the message says why."""


@dataclass(frozen=True)
class Mutation:
    op: str
    path: str
    content: str
    reason: str


def parse_mutation(reply: str, max_bytes: int) -> Mutation:
    """The first JSON object in a model's reply, as a checked mutation."""
    data = _first_json_object(reply)
    if data is None:
        raise MutationRefused(f"no JSON object in the proposal: {reply[:160]!r}")
    op, path = data.get("op"), data.get("path")
    content, reason = data.get("content", ""), data.get("reason", "")
    if op not in OPS:
        raise MutationRefused(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if not isinstance(path, str) or not isinstance(content, str) or not isinstance(reason, str):
        raise MutationRefused("path, content and reason must be strings")
    mutation = Mutation(op, path, content, reason.strip() or "no reason given")
    check(mutation, max_bytes)
    return mutation


def check(mutation: Mutation, max_bytes: int) -> None:
    pure = PurePosixPath(mutation.path)
    if pure.is_absolute() or ".." in pure.parts or not EDITABLE.match(mutation.path):
        raise MutationRefused(
            f"path {mutation.path!r} is outside the harness tree: use AGENTS.md, examples.jsonl, "
            "rules/<name>.md or skills/<name>/SKILL.md"
        )
    if mutation.op != "remove" and not mutation.content.strip():
        raise MutationRefused(f"{mutation.op} of {mutation.path} has empty content")
    if len(mutation.content.encode()) > max_bytes:
        raise MutationRefused(f"content for {mutation.path} is over {max_bytes} bytes")
    if mutation.path == "examples.jsonl" and mutation.op != "remove":
        for line in filter(str.strip, mutation.content.splitlines()):
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            if not (isinstance(item, dict) and {"user", "assistant"} <= set(item)):
                raise MutationRefused('examples.jsonl lines must be {"user": …, "assistant": …}')


def apply(files: dict[str, bytes], mutation: Mutation) -> dict[str, bytes]:
    """A copy of the tree with the mutation applied."""
    changed = dict(files)
    exists = mutation.path in files
    if mutation.op == "create" and exists:
        raise MutationRefused(f"{mutation.path} already exists: use update")
    if mutation.op in ("update", "remove") and not exists:
        raise MutationRefused(f"{mutation.path} does not exist: use create")
    if mutation.op == "remove":
        del changed[mutation.path]
    else:
        changed[mutation.path] = mutation.content.encode()
    if changed == files:
        raise MutationRefused("the mutation changes nothing")
    return changed


def _first_json_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
