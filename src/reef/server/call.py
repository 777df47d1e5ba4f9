"""A call's context: what serves it, fixed when it arrives, and how its record names who answered.

`ServerState.call_context` builds it from the call's headers; a room passes it to the serving
core, and the teacher (`reef.server.teacher`) returns it changed when it takes the call over.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from reef.errors import BadRequest
from reef.inference.binding import Binding
from reef.protocol import ChatRequest

TAG_PREFIX = "x-reef-tag-"
TAG_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
MAX_TAGS = 16
MAX_TAG_VALUE = 256


@dataclass(frozen=True)
class CallContext:
    scenario: str
    session: str | None
    capture: bool
    binding: Binding  # the release serving this call, fixed for the whole call
    max_tokens: int | None = None  # the scenario's cap on an answer (generation.max_tokens)
    # Under a routing policy: (the release whose policy routed the call, the arm it took).
    route: tuple[str, str] | None = None
    answered_by: str | None = None  # who answered instead of the engine (the teacher)
    failed_arm: str | None = None  # the arm whose answer the teacher replaced
    # The client's `x-reef-tag-<name>` headers (`tags_of`), stored with the record.
    tags: dict[str, str] = field(default_factory=dict)
    # The caller's trace (its W3C `traceparent`), kept in the record when Reef traces nothing.
    caller_trace_id: str | None = None

    @property
    def release_id(self) -> str:
        return self.binding.release_id

    def release_headers(self) -> dict[str, str]:
        """The release that serves the call, and the arm it took under a routing policy."""
        headers = {"x-reef-release-id": self.release_id}
        if self.route is not None:
            headers["x-reef-arm"] = self.route[1]
        return headers

    def served(self, request: ChatRequest) -> ChatRequest:
        """The request as the engine runs it: under the call's release, within the cap (the
        record keeps what the client sent)."""
        return self.binding.apply(request).capped(self.max_tokens)


def tags_of(headers: Mapping[str, str]) -> dict[str, str]:
    """The call's tags: each `x-reef-tag-<name>: <value>` header, `name` lowercase letters,
    digits and `_.-` (up to 64), the value up to 256 characters, 16 tags at most."""
    tags = {
        name[len(TAG_PREFIX) :]: value
        for name, value in headers.items()
        if name.lower().startswith(TAG_PREFIX)
    }
    if len(tags) > MAX_TAGS:
        raise BadRequest(f"at most {MAX_TAGS} x-reef-tag-* headers may tag a call, not {len(tags)}")
    for name, value in tags.items():
        if not TAG_NAME.fullmatch(name.lower()):
            raise BadRequest(
                f"x-reef-tag-{name}: a tag's name is lowercase letters, digits and _.- "
                "(up to 64, starting with a letter or digit)"
            )
        if len(value) > MAX_TAG_VALUE:
            raise BadRequest(
                f"x-reef-tag-{name}: a tag's value is at most {MAX_TAG_VALUE} characters"
            )
    return {name.lower(): value for name, value in tags.items()}
