"""`GET /metrics`: the server's Prometheus metrics, in Prometheus' text format.

What the serving path counts as it answers is in `reef.server.metrics`; everything that already
exists as state is read here when Prometheus scrapes, by collectors: the engine's queue, slots
and KV cache, the store writer's commits, the heads served, canaries, shadows and teachers, and
the learning worker's bookkeeping in the store (the worker runs in another process: the store is
where its steps are). The scrape runs in the thread pool, off the event loop (it reads the store).
With the vLLM engine, the child's own `vllm:` families follow Reef's (`VLLMEngine.child_metrics`).

The route is guarded like every route but /healthz: an inference or admin token once the server
has any (open without one, on loopback). `server.metrics_token` (REEF_METRICS_TOKEN) is a token
that reads /metrics and nothing else, for a scraper that should not be able to call the model;
it is checked here, before the bearer middleware, which does not know it.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.engines.base import ServesChildMetrics, Slotted
from reef.errors import BadRequest, ReefError, Unauthorized
from reef.evaluation.live import against_gate, learning_progress
from reef.server.auth import provided_token
from reef.server.metrics import PREFIX
from reef.server.state import ServerState
from reef.store import ExperienceStore
from reef.store.learning import (
    candidate_totals,
    learning_counts,
    newest_candidate_metrics,
    signal_yield,
    step_totals,
)
from reef.store.writer import Buckets

log = logging.getLogger("reef.server")
PATH = "/metrics"
DECIDED = ("released", "rejected", "held")


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=buckets.cumulative(), sum_value=buckets.total)


class EngineCollector:
    """Requests running and waiting, the llama.cpp engine's slots and KV cache, its prompt
    cache, and the HTTP requests in flight."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        state, engine = self.state, self.state.engine
        slotted = engine if isinstance(engine, Slotted) else None
        if slotted is not None:
            admitted, slots = slotted.in_flight, slotted.slots
            running, waiting = min(admitted, slots), max(0, admitted - slots)
        else:  # an engine that does not queue: every call in flight runs (upstream, vLLM)
            running, waiting = state.metrics.generating, 0
        yield GaugeMetricFamily(
            f"{PREFIX}num_requests_running", "Generation requests running", value=running
        )
        yield GaugeMetricFamily(
            f"{PREFIX}num_requests_waiting", "Generation requests waiting for a slot", value=waiting
        )
        yield GaugeMetricFamily(
            f"{PREFIX}http_requests_in_flight",
            "HTTP requests being answered (this scrape included)",
            value=state.in_flight.count,
        )
        if slotted is None:
            return
        yield GaugeMetricFamily(
            f"{PREFIX}llamacpp_slots", "llama.cpp slots (engine.llamacpp.slots)", value=slots
        )
        yield GaugeMetricFamily(
            f"{PREFIX}llamacpp_slots_busy",
            "llama.cpp slots running a request (live or background)",
            value=slotted.slots_busy,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}kv_cache_usage_perc",
            "Share of the KV cache's cells holding a token (0 to 1)",
            value=slotted.kv_cache_usage,
        )
        counters = slotted.cache_counters
        yield CounterMetricFamily(
            f"{PREFIX}prefix_cache_queries",
            "Prompt tokens of the requests the engine started",
            value=counters.get("prompt_tokens", 0),
        )
        yield CounterMetricFamily(
            f"{PREFIX}prefix_cache_hits",
            "Of those, tokens served from a slot's prompt cache",
            value=counters.get("reused_tokens", 0),
        )


class StoreCollector:
    """The experience store's writer in this process: commit time, jobs per commit, failures."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stats = self.state.store.writer_stats
        yield _histogram(
            f"{PREFIX}store_write_seconds",
            "A commit's wall time on the store's writer, from its first job to its commit",
            stats.commit_seconds,
        )
        yield _histogram(
            f"{PREFIX}store_group_commit_size", "Writes committed together", stats.group_size
        )
        yield CounterMetricFamily(
            f"{PREFIX}store_unavailable",
            "Commits that failed: the store could not be written (nothing of them was stored)",
            value=stats.unavailable,
        )


class ReleaseCollector:
    """The release each scenario serves, canaries, shadows and teachers."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        state = self.state
        head = InfoMetricFamily(
            f"{PREFIX}release_head",
            "The release each scenario serves on this server (base: no release yet)",
            labels=["scenario"],
        )
        for scenario, binding in sorted(state.bindings.items()):
            head.add_metric([scenario], {"release_id": binding.release_id, "kind": binding.kind})
        yield head
        errors = GaugeMetricFamily(
            f"{PREFIX}release_error",
            "1 while a scenario's head cannot be served (it serves the release before)",
            labels=["scenario"],
        )
        for scenario in sorted(state.release_errors):
            errors.add_metric([scenario], 1)
        yield errors
        mismatch = GaugeMetricFamily(
            f"{PREFIX}release_mismatch",
            "1 while a scenario's release, probed after its swap, answers its own gate tasks "
            "otherwise than the gate judged (it serves something else than what was released)",
            labels=["scenario"],
        )
        for scenario in sorted(state.bindings):
            mismatch.add_metric([scenario], 1 if scenario in state.release_mismatch else 0)
        yield mismatch
        yield from self._canaries()
        yield from self._shadows()
        yield from self._teachers()

    def _canaries(self) -> Iterator[Metric]:
        reports = GaugeMetricFamily(
            f"{PREFIX}canary_reports",
            "Sessions reported on each arm of a running canary",
            labels=["candidate", "arm"],
        )
        means = GaugeMetricFamily(
            f"{PREFIX}canary_score_mean",
            "The mean score of each arm of a running canary",
            labels=["candidate", "arm"],
        )
        action = GaugeMetricFamily(
            f"{PREFIX}canary_state",
            "1 for a running canary's latest verdict (wait, promote, rollback)",
            labels=["candidate", "action"],
        )
        for candidate, verdict in sorted(self.state.canaries.items()):
            for arm, scores in (("stable", verdict.stable), ("canary", verdict.canary)):
                reports.add_metric([candidate, arm], scores.reports)
                if scores.mean is not None:
                    means.add_metric([candidate, arm], scores.mean)
            action.add_metric([candidate, str(verdict.action)], 1)
        yield from (reports, means, action)

    def _shadows(self) -> Iterator[Metric]:
        copies = CounterMetricFamily(
            f"{PREFIX}shadow_copies",
            "Copies of live calls sent to candidates in shadow, by what became of them",
            labels=["scenario", "candidate", "outcome"],
        )
        status = self.state.shadows.status() if self.state.shadows else {}
        for candidate, counts in sorted(status.items()):
            scenario = str(counts.get("scenario", ""))
            for outcome, n in sorted(counts.items()):
                if outcome != "scenario" and isinstance(n, int):
                    copies.add_metric([scenario, candidate, outcome], n)
        yield copies

    def _teachers(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            f"{PREFIX}teacher_calls",
            "Calls the scenario's teacher answered, by why it took over",
            labels=["scenario", "reason"],
        )
        share = GaugeMetricFamily(
            f"{PREFIX}teacher_share",
            "The teacher's share of the calls it could take over",
            labels=["scenario"],
        )
        tokens = CounterMetricFamily(
            f"{PREFIX}teacher_tokens",
            "Tokens the teacher's calls cost",
            labels=["scenario", "kind"],
        )
        failures = CounterMetricFamily(
            f"{PREFIX}teacher_failures",
            "Teacher calls that failed (the student's answer stood)",
            labels=["scenario"],
        )
        for scenario, teacher in sorted(self.state.teachers.items()):
            costs = teacher.costs
            for reason, n in sorted(costs.calls.items()):
                calls.add_metric([scenario, reason], n)
            shown = costs.to_json()
            if shown["share_of_calls"] is not None:
                share.add_metric([scenario], shown["share_of_calls"])
            tokens.add_metric([scenario, "prompt"], costs.prompt_tokens)
            tokens.add_metric([scenario, "completion"], costs.completion_tokens)
            failures.add_metric([scenario], costs.failures)
        yield from (calls, share, tokens, failures)


class LearningCollector:
    """The learning worker's bookkeeping, read from the store (the worker is another process,
    perhaps on another replica: these are the store's figures, the same on every replica)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except Exception as error:  # the store is away: serving metrics still come
            log.warning("learning metrics unavailable: %s", error)
            yield CounterMetricFamily(
                f"{PREFIX}learning_metrics_errors", "Scrapes whose learning figures failed", 1
            )

    def _collect(self) -> Iterator[Metric]:
        store = self.state.store
        steps = CounterMetricFamily(
            f"{PREFIX}learning_steps",
            "Learning steps taken, by recipe and outcome",
            labels=["scenario", "recipe", "outcome"],
        )
        seconds = SummaryMetricFamily(
            f"{PREFIX}learning_step_seconds",
            "Wall time of the learning steps (training and gate)",
            labels=["scenario", "recipe"],
        )
        per_recipe: dict[tuple[str, str], tuple[int, float]] = {}
        for row in step_totals(store):
            key = (row["scenario"], row["recipe"] or "")
            steps.add_metric([*key, row["outcome"]], row["n"])
            count, total = per_recipe.get(key, (0, 0.0))
            per_recipe[key] = (count + int(row["n"]), total + float(row["s"] or 0.0))
        for key, (count, total) in sorted(per_recipe.items()):
            seconds.add_metric(list(key), count_value=count, sum_value=total)
        yield from (steps, seconds)
        yield from self._candidates(store)
        yield from self._status(store)
        yield from self._progress(store)

    def _candidates(self, store: ExperienceStore) -> Iterator[Metric]:
        candidates = GaugeMetricFamily(
            f"{PREFIX}candidates",
            "Candidates by state (released, rejected, held: the gate's decision; or open)",
            labels=["scenario", "state"],
        )
        gate = SummaryMetricFamily(
            f"{PREFIX}gate_seconds",
            "Decided candidates' time from proposal to decision (the gate's wall time)",
            labels=["scenario"],
        )
        decided: dict[str, tuple[int, float]] = {}
        for row in candidate_totals(store):
            candidates.add_metric([row["scenario"], row["state"]], row["n"])
            if row["state"] in DECIDED:
                count, total = decided.get(row["scenario"], (0, 0.0))
                decided[row["scenario"]] = (count + int(row["n"]), total + float(row["s"] or 0.0))
        for scenario, (count, total) in sorted(decided.items()):
            gate.add_metric([scenario], count_value=count, sum_value=total)
        yield from (candidates, gate)

    def _status(self, store: ExperienceStore) -> Iterator[Metric]:
        consumed = GaugeMetricFamily(
            f"{PREFIX}learning_records_consumed",
            "Records the scenario's candidates consumed (as of the worker's last look)",
            labels=["scenario"],
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}learning_records_waiting",
            "Records waiting to be learned from",
            labels=["scenario"],
        )
        stale = GaugeMetricFamily(
            f"{PREFIX}learning_stale_records_dropped",
            "Records left out as too stale to learn from (max_staleness)",
            labels=["scenario"],
        )
        for row in learning_counts(store):
            consumed.add_metric([row["scenario"]], row["consumed"] or 0)
            waiting.add_metric([row["scenario"]], row["waiting"] or 0)
            stale.add_metric([row["scenario"]], row["stale_skipped"] or 0)
        yield from (consumed, waiting, stale)
        loss = GaugeMetricFamily(
            f"{PREFIX}training_loss",
            "The last training loss of each recipe's newest candidate",
            labels=["scenario", "recipe"],
        )
        for row in newest_candidate_metrics(store):
            value = _last_loss(row["metrics"])
            if value is not None:
                loss.add_metric([row["scenario"], row["source"] or ""], value)
        yield loss


    def _progress(self, store: ExperienceStore) -> Iterator[Metric]:
        """Is it learning: each release's live pass rate and its calls, by signal (users'
        reports, the recipe's scorer); and what became of the feedback (`signal_yield`)."""
        rate = GaugeMetricFamily(
            f"{PREFIX}live_pass_rate",
            "Share of a release's live calls that passed (reports: mean score at or above the "
            "gate's replay_threshold; scorer: the recipe's scorer accepts the answer; shadowed "
            "and base_shadow: the release's and the base's answers to the calls the base "
            "shadowed, by the scorer)",
            labels=["scenario", "release", "signal"],
        )
        calls = GaugeMetricFamily(
            f"{PREFIX}live_pass_rate_calls",
            "The calls each live pass rate is over",
            labels=["scenario", "release", "signal"],
        )
        predicted = GaugeMetricFamily(
            f"{PREFIX}gate_pass_rate",
            "Share of the sampled answers a release passed on the feedback group at its gate: "
            "what the gate predicted users would see",
            labels=["scenario", "release"],
        )
        below = GaugeMetricFamily(
            f"{PREFIX}release_below_gate",
            "1 when a release's live pass rate lies below its gate's estimate beyond both 95% "
            "intervals (the gate did not predict what users saw), else 0",
            labels=["scenario", "release"],
        )
        chain = self.state.workflow.chain
        for scenario, releases in learning_progress(store, self.state.config).items():
            for release in releases:
                judged = against_gate(chain.evaluation_of(release.release_id), release)
                if judged["gate"] is not None:
                    labels = [scenario, release.release_id]
                    predicted.add_metric(labels, judged["gate"]["rate"])
                    below.add_metric(labels, float(judged["below_gate"] is not None))
                signals = (
                    ("reports", release.reports),
                    ("scorer", release.scorer),
                    ("shadowed", release.shadowed),
                    ("base_shadow", release.base_shadow),
                )
                for signal, found in signals:
                    if found is None or not found.count:
                        continue
                    labels = [scenario, release.release_id, signal]
                    rate.add_metric(labels, found.passed / found.count)
                    calls.add_metric(labels, found.count)
        learned = GaugeMetricFamily(
            f"{PREFIX}learning_signal_learned_from",
            "Calls the scenario's candidates learned from, over its steps",
            labels=["scenario"],
        )
        dropped = GaugeMetricFamily(
            f"{PREFIX}learning_signal_dropped",
            "Turns or answers the scenario's steps could not learn from, by reason",
            labels=["scenario", "reason"],
        )
        for scenario, totals in signal_yield(store).items():
            learned.add_metric([scenario], totals["learned_from"])
            for reason, count in sorted(totals["dropped"].items()):
                dropped.add_metric([scenario, reason], count)
        yield from (rate, calls, predicted, below, learned, dropped)


def _last_loss(metrics: str | None) -> float | None:
    try:
        found = json.loads(metrics or "null")
    except ValueError:
        return None
    loss = found.get("loss") if isinstance(found, dict) else None
    if isinstance(loss, list):
        loss = loss[-1] if loss else None
    if isinstance(loss, int | float) and math.isfinite(loss):
        return float(loss)
    return None


def install_collectors(state: ServerState) -> None:
    """Register the scrape-time collectors on the state's registry, once."""
    metrics = state.metrics
    if metrics.collectors_installed:
        return
    for collector in (
        EngineCollector(state),
        StoreCollector(state),
        ReleaseCollector(state),
        LearningCollector(state),
    ):
        metrics.registry.register(collector)
    metrics.collectors_installed = True


def _matches(provided: str, tokens: Iterable[str]) -> bool:
    offered, matched = provided.encode(), False
    for token in tokens:
        matched |= hmac.compare_digest(offered, token.encode())
    return matched


class MetricsRoute:
    """ASGI middleware answering GET /metrics before the bearer middleware (which does not
    know `server.metrics_token`); every other path goes on."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        config = state.config
        self.tokens = [*config.token_values(), *config.admin_token_values()]
        secret = config.server.metrics_token
        self.metrics_token = secret.get_secret_value() if secret is not None else None
        install_collectors(state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            headers = [(b"content-type", b"application/json")]
            if refusal.status == 401:
                headers.append((b"www-authenticate", b"Bearer"))
            await _answer(send, refusal.status, headers, json.dumps(refusal.to_json()).encode())
            return
        body = await run_in_threadpool(generate_latest, self.state.metrics.registry)
        engine = self.state.engine
        if isinstance(engine, ServesChildMetrics):  # vLLM's own, passed through (`vllm:` families)
            body += await engine.child_metrics()
        head = scope["method"] == "HEAD"
        await _answer(
            send,
            200,
            [(b"content-type", CONTENT_TYPE_LATEST.encode())],
            b"" if head else body,
        )

    def _refusal(self, scope: Scope) -> ReefError | None:
        if scope["method"] not in ("GET", "HEAD"):
            return BadRequest(
                f"{scope['method']} is not allowed on {PATH}: GET it", code="405", status=405
            )
        accepted = [*self.tokens, *([self.metrics_token] if self.metrics_token else [])]
        if not accepted:
            return None  # a server without any token (loopback only): open, as every route
        provided = provided_token(scope)
        if provided and _matches(provided, accepted):
            return None
        if provided:
            return Unauthorized("invalid token: send server.metrics_token or REEF_TOKEN's value")
        return Unauthorized(
            "missing token: send `Authorization: Bearer $REEF_METRICS_TOKEN` (or $REEF_TOKEN)"
        )


async def _answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
