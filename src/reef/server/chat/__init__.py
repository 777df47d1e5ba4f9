"""The chat completions room: `/v1/chat/completions` and `/v1/models`."""

from reef.server.chat.routes import routes

__all__ = ["routes"]
