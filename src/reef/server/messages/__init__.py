"""The Anthropic Messages room: `/v1/messages` (`translate`: to and from chat)."""

from reef.server.messages.routes import routes

__all__ = ["routes"]
