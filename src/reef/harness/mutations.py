"""Changes to a harness tree: one change to one file, checked before it is applied.

The rules every change meets, whoever proposes it (a recipe's proposer, or an agent through
`POST /reef/harness/proposals`): a path inside the tree's editable files, an op that fits the
file (create what is absent, update or remove what is there), content that is not empty nor
oversized, worked examples that are JSON lines, and a tree that changes. A change that breaks a
rule is refused with the rule, never applied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from reef.errors import ReefError

OPS = ("create", "update", "remove")
EDITABLE = re.compile(
    r"^(AGENTS\.md|examples\.jsonl|rules/[a-z0-9_-]+\.md|skills/[a-z0-9_-]+/SKILL\.md)$"
)
MAX_CONTENT_BYTES = 8000
# Upstream Reef's entry kinds (`options.name`) and where each lives in this tree.
ENTRY_PATHS = {"rules": "rules/{id}.md", "skills": "skills/{id}/SKILL.md"}
ENTRY_ID = re.compile(r"[a-z0-9_-]{1,64}")


class MutationRefused(ReefError):
    status = 400
    code = "mutation_refused"


@dataclass(frozen=True)
class Mutation:
    op: str
    path: str
    content: str
    reason: str


def check(mutation: Mutation, max_bytes: int = MAX_CONTENT_BYTES) -> None:
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


def mutation_from(data: Any, reason: str = "") -> Mutation:
    """A mutation as a client sends it, checked: Reef's `{op, path, content}`, or upstream
    Reef's entry `{op, id, options: {name: rules|skills, config: {text}}}`."""
    if not isinstance(data, dict):
        raise MutationRefused("each mutation must be an object: {op, path, content}")
    op = data.get("op")
    if op not in OPS:
        raise MutationRefused(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if "path" in data:
        path, content = data["path"], data.get("content", "")
    else:
        path, content = _entry(data)
    if not isinstance(path, str) or not isinstance(content, str):
        raise MutationRefused("path and content must be strings")
    mutation = Mutation(op, path, content, reason or "no reason given")
    check(mutation)
    return mutation


def _entry(data: dict[str, Any]) -> tuple[str, str]:
    """Upstream's entry (`id` and `options`) as a path of this tree and its text."""
    entry_id, options = data.get("id"), data.get("options") or {}
    if not isinstance(entry_id, str) or not ENTRY_ID.fullmatch(entry_id):
        raise MutationRefused("a mutation needs `path`, or an entry `id` (a-z, 0-9, _ and -)")
    if not isinstance(options, dict):
        raise MutationRefused("an entry's `options` must be an object: {name, config}")
    name = options.get("name")
    if data["op"] == "remove" and name is None:
        raise MutationRefused(f"remove {entry_id}: say which kind (`options.name`: rules, skills)")
    if name not in ENTRY_PATHS:
        kinds = ", ".join(ENTRY_PATHS)
        raise MutationRefused(f"entry kind {name!r} is not one this tree renders: {kinds}")
    config = options.get("config") or {}
    text = config.get("text", "") if isinstance(config, dict) else ""
    return ENTRY_PATHS[name].format(id=entry_id), text if isinstance(text, str) else ""
