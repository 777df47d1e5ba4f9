"""The text completions room: `/v1/completions` (`text`: the wire shape)."""

from reef.server.completions.routes import routes

__all__ = ["routes"]
