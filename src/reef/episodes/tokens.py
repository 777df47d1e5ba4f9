"""Per-episode tokens: `reef-ep.<payload>.<mac>`, stateless and signed.

The payload names the scenario, the episode (its session), the task, the tree and an expiry. The
MAC is an HMAC-SHA256 under a key derived from one of the server's tokens (inference, admin or
internal), so whoever holds a Reef token can mint one for an episode, and the server checks it
against every token it knows, in constant time. The agent in the sandbox gets only this token:
it serves inference for that scenario until the episode's deadline, and nothing else.

Only the standard library: `reef.server.auth` imports this module.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from dataclasses import dataclass

PREFIX = "reef-ep."
# A grant whose tree is `candidate:<id>` has its calls served by that candidate (the gate's
# episodes, reef.episodes.gate), one whose tree is `trial:<digest>` by a harness tree a recipe is
# trying (reef.inference.trials); any other tree is served by what the scenario serves.
CANDIDATE_TREE = "candidate:"
TRIAL_TREE = "trial:"
KEY_LABEL = b"reef episode token v1"
EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class BadEpisodeToken(ValueError):
    """A token that looks like an episode's but is not valid (forged, expired, malformed)."""


@dataclass(frozen=True)
class EpisodeGrant:
    """What an episode token allows: inference in `scenario`, recorded under `episode`."""

    scenario: str
    episode: str
    task: str
    tree: str
    expires_at: float


def candidate_tree(candidate_id: str) -> str:
    """The tree label under which the server serves an episode's calls with a candidate."""
    return f"{CANDIDATE_TREE}{candidate_id}"


def candidate_of(tree: str) -> str | None:
    """The candidate a tree label names, or None for any other tree."""
    return tree.removeprefix(CANDIDATE_TREE) if tree.startswith(CANDIDATE_TREE) else None


def trial_tree(digest: str) -> str:
    """The tree label under which the server serves an episode's calls with a trial tree."""
    return f"{TRIAL_TREE}{digest}"


def trial_of(tree: str) -> str | None:
    """The trial tree a tree label names, or None for any other tree."""
    return tree.removeprefix(TRIAL_TREE) if tree.startswith(TRIAL_TREE) else None


def is_episode_token(token: str) -> bool:
    return token.startswith(PREFIX)


def mint(grant: EpisodeGrant, signing_token: str) -> str:
    """The token for `grant`, signed with a key derived from `signing_token` (a Reef token)."""
    if not EPISODE_ID.fullmatch(grant.episode):
        raise ValueError(f"episode id {grant.episode!r}: letters, digits and _.- only")
    fields = {
        "s": grant.scenario,
        "e": grant.episode,
        "k": grant.task,
        "r": grant.tree,
        "x": int(grant.expires_at),
    }
    payload = _b64(json.dumps(fields, separators=(",", ":"), sort_keys=True).encode())
    return f"{PREFIX}{payload}.{_b64(_mac(_key(signing_token), payload))}"


def verify(token: str, known_tokens: list[str], now: float | None = None) -> EpisodeGrant:
    """The grant `token` carries, if one of `known_tokens` signed it and it has not expired."""
    payload, _, mac = token.removeprefix(PREFIX).partition(".")
    try:
        offered = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
    except ValueError:
        raise BadEpisodeToken("malformed episode token") from None
    matched = False
    for known in known_tokens:  # every key is tried, whichever matches
        matched |= hmac.compare_digest(offered, _mac(_key(known), payload))
    if not matched:
        raise BadEpisodeToken("episode token not signed by this server")
    grant = _grant(payload)
    if grant.expires_at < (time.time() if now is None else now):
        raise BadEpisodeToken(f"episode token of {grant.episode!r} has expired")
    return grant


def _grant(payload: str) -> EpisodeGrant:
    try:
        fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return EpisodeGrant(
            scenario=str(fields["s"]),
            episode=str(fields["e"]),
            task=str(fields["k"]),
            tree=str(fields["r"]),
            expires_at=float(fields["x"]),
        )
    except (ValueError, KeyError, TypeError):
        raise BadEpisodeToken("malformed episode token") from None


def _key(token: str) -> bytes:
    return hmac.new(token.encode(), KEY_LABEL, hashlib.sha256).digest()


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, payload.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
