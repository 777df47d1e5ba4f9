"""Reef's app served in a thread of the test's own process, for the tests that reach into its
state while it serves (an exporter, a store lock): the engine and the teachers start with the
app and close with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from reef.server.app import create_app
from reef.server.state import ServerState
from reef.testing.threaded import served_in_thread


@contextmanager
def serving(state: ServerState) -> Iterator[str]:
    """Serve `state` until the block ends; yields the base URL."""
    app = create_app(state)

    @asynccontextmanager
    async def engine_started(app: Any) -> AsyncIterator[None]:
        await state.engine.start()
        for teacher in state.teachers.values():
            await teacher.start()
        try:
            yield
        finally:
            for teacher in state.teachers.values():
                await teacher.close()
            await state.engine.close()

    app.router.lifespan_context = engine_started
    with served_in_thread(app, "reef") as url:
        yield url
