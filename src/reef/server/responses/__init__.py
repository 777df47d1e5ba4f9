"""The Responses API room: `/v1/responses` (`request`: its input as chat messages, `output`:
the chat answer as its output items and stream events)."""

from reef.server.responses.routes import routes

__all__ = ["routes"]
