"""The embeddings room: `/v1/embeddings`."""

from reef.server.embeddings.routes import routes

__all__ = ["routes"]
