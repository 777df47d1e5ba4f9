"""Harness mutations as a proposer model writes them: the first JSON object in its reply, held to
the rules every change to a tree meets (`reef.harness.mutations`, shared with the proposals
agents send). Anything that is not one well-formed change inside the tree (unparseable, empty,
oversized, a path outside the tree) is refused with a reason, never applied.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reef.sdk import (
    EDITABLE,
    Mutation,
    ProposalRefused,
    TreeChangeRefused,
    apply_mutation,
    check_mutation,
)

__all__ = ["EDITABLE", "Mutation", "MutationRefused", "apply", "check", "parse_mutation"]
OPS = ("create", "update", "remove")


class MutationRefused(ProposalRefused):
    """The proposal is not a usable mutation; the message says why."""


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
    try:
        check_mutation(mutation, max_bytes)
    except TreeChangeRefused as refused:
        raise MutationRefused(refused.message) from None


def apply(files: dict[str, bytes], mutation: Mutation) -> dict[str, bytes]:
    """A copy of the tree with the mutation applied."""
    try:
        return apply_mutation(files, mutation)
    except TreeChangeRefused as refused:
        raise MutationRefused(refused.message) from None


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
