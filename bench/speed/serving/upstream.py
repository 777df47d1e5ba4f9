"""Part 2, upstream overhead: the latency Reef adds as a recording proxy in front of the
loopback OpenAI-compatible peer, with its defaults, with `store.synchronous: normal` (the cost
of an fsync per commit) and with `server.log_level: warning` (the cost of logging every call).
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common.serving.config import (
    PEER_DIRECT,
    REEF_DEFAULTS,
    REEF_NORMAL,
    REEF_QUIET_LOG,
    UPSTREAM_CONCURRENCY,
    UPSTREAM_TIMEOUT_S,
    Options,
    console,
)
from bench.common.serving.load import Load, measure_rounds, warm_up
from bench.common.serving.servers import (
    new_folder,
    openai_peer,
    pids_of,
    reef_upstream_server,
    running,
)
from bench.common.serving.stats import Measurement


def upstream_body() -> dict[str, Any]:
    return {"model": "peer", "messages": [{"role": "user", "content": "hello there"}]}


def run_upstream_part(options: Options) -> list[Measurement]:
    console.rule("[bold]Part 2: upstream overhead (Reef as a recording proxy)")
    body = upstream_body()
    with tempfile.TemporaryDirectory(prefix="reef-bench-") as tmp, ExitStack() as servers:
        console.print("starting the peer and three Reef servers in front of it ...")
        peer = servers.enter_context(running(openai_peer(Path(tmp))))
        defaults = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "defaults"), peer.url))
        )
        normal = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "normal"), peer.url, "normal"))
        )
        quiet_log = servers.enter_context(
            running(reef_upstream_server(new_folder(tmp, "warning"), peer.url, log_level="warning"))
        )
        pids = pids_of(peer, defaults, normal, quiet_log)
        direct = Load(
            "upstream", PEER_DIRECT, peer.url, body, timeout_s=UPSTREAM_TIMEOUT_S, server_pids=pids
        )
        loads = [
            direct,
            replace(direct, setting=REEF_DEFAULTS, url=defaults.url),
            replace(direct, setting=REEF_NORMAL, url=normal.url),
            replace(direct, setting=REEF_QUIET_LOG, url=quiet_log.url),
        ]
        for load in loads:
            warm_up(load, options.upstream_warmup)
        counts = list(zip(UPSTREAM_CONCURRENCY, options.upstream_requests, strict=True))
        return measure_rounds(loads, counts, options)
