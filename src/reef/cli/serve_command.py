"""`reef serve`: resolve the config, pick the engine, open the store, serve in the foreground."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.logging import RichHandler

from reef.cli.output import console, fail
from reef.config import ConfigError, EngineKind, load_config
from reef.engines import build_engine, resolve_kind
from reef.errors import ReefError
from reef.learning.plans import load_plans
from reef.releases.workflow import ReleaseWorkflow
from reef.store import ExperienceStore
from reef.tracing import start_tracing


def serve(
    config: Annotated[
        Path | None,
        typer.Option("-c", "--config", help="Config file (default: ./reef.yaml when present)."),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8900).")] = None,
    engine: Annotated[
        EngineKind | None, typer.Option(help="auto, llamacpp, vllm or upstream.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="GGUF path (llamacpp) or model id (vllm).")
    ] = None,
    upstream_url: Annotated[
        str | None, typer.Option(help="Base URL with /v1 for --engine upstream.")
    ] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the resolved config and exit.")
    ] = False,
) -> None:
    """Serve OpenAI-compatible inference, storing every call as experience."""
    # The server's modules load here, not when the CLI starts: every other command (`reef
    # status`, `reef release list`, `reef --version`) would pay for them (issue 75).
    from reef.daemon.run import check_bind, check_port_free, run
    from reef.server.state import ServerState

    overrides = {
        "server.host": host,
        "server.port": port,
        "engine.kind": engine,
        "engine.llamacpp.model": model,
        "engine.vllm.model": model,
        "engine.upstream.url": upstream_url,
    }
    try:
        resolved = load_config(config, overrides)
    except ConfigError as error:
        fail(str(error), code=2)
    if print_config:
        try:
            load_plans(resolved)  # the recipes' own settings are the config too
        except ReefError as error:
            fail(error.message, code=2)
        # Written as it is: rich would wrap a long line (a deep path) at the terminal's width,
        # and the YAML would no longer read back.
        sys.stdout.write(yaml.safe_dump(resolved.redacted(), sort_keys=False))
        return
    logging.basicConfig(
        level=resolved.server.log_level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    if resolved.server.log_level != "debug":
        # httpx logs every upstream call at info: a line per request on the serving loop.
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        check_bind(
            resolved.server.host, bool(resolved.server.tokens or resolved.server.admin_tokens)
        )
        check_port_free(resolved.server.host, resolved.server.port)  # before the model loads
        load_plans(resolved)  # a bad recipe stops start-up, before anything is loaded
        kind, reason = resolve_kind(resolved.engine)
        serving_engine = build_engine(
            resolved.engine, resolved.server.max_queue, resolved.state_dir
        )
        store = ExperienceStore(resolved.experience_store, resolved.store.synchronous)
        tracing = start_tracing(resolved.otel, os.environ)
    except ReefError as error:
        fail(error.message, code=2 if error.status == 400 else 1)
    url = f"http://{resolved.server.host}:{resolved.server.port}"
    console.print(
        f"Reef: engine [bold]{kind}[/] ({reason}), model [bold]{serving_engine.model}[/], "
        f"experience in {store.name}: starting the engine",
        highlight=False,
        soft_wrap=True,
    )

    def announce() -> None:
        console.print(f"Reef: serving on [bold]{url}/v1[/]", highlight=False, soft_wrap=True)

    workflow = ReleaseWorkflow(resolved, store)
    workflow.tracing = tracing  # a candidate approved here: its publish is a span
    state = ServerState(
        config=resolved,
        engine=serving_engine,
        store=store,
        workflow=workflow,
        engine_reason=reason,
        tracing=tracing,
    )
    try:
        run(state, announce)
    except ReefError as error:
        fail(error.message)
    except KeyboardInterrupt:
        pass
