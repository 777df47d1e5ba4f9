"""A call's context: what serves it, fixed when it arrives, and how its record names who answered.

`ServerState.call_context` builds it from the call's headers; a room passes it to the serving
core, and the teacher (`reef.server.teacher`) returns it changed when it takes the call over.
"""

from __future__ import annotations

from dataclasses import dataclass

from reef.inference.binding import Binding
from reef.protocol import ChatRequest


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
