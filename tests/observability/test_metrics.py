"""GET /metrics of a real `reef serve` on the embedded model, read with Prometheus' own parser:
counters move by exactly what was sent (chat calls, a stream, a report, a release switch), the
latency histograms have vLLM's buckets, and the route is guarded (a tokenless scrape is a 401,
the metrics token reads /metrics and nothing else). One server for the whole module."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reef.server.metrics import E2E_LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from reef.testing.artifacts import harness
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from tests.conftest import SMALL_ENGINE, write_config

TOKEN = "observability-token"
METRICS_TOKEN = "scrape-only-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SCENARIO = "observed"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("observability")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    write_config(
        folder,
        SMALL_ENGINE + f"gate:\n  policy: always\nserver:\n  metrics_token: {METRICS_TOKEN}\n",
    )
    process = reef_serve(folder, free_port(), env={"REEF_TOKEN": TOKEN})
    with process.start():
        yield process


def scrape(server: ServerProcess, token: str = TOKEN) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and each family's type."""
    response = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(server: ServerProcess, stream: bool = False) -> str:
    """A call in SCENARIO; its receipt."""
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}
    headers = {**AUTH, "x-reef-scenario": SCENARIO}
    if not stream:
        response = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120
        )
        response.raise_for_status()
        return response.headers["x-reef-agent-record-id"]
    receipt = None
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=120,
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])
                receipt = (chunk.get("reef") or {}).get("agent_record_id") or receipt
    assert receipt is not None
    return receipt


def usage(server: ServerProcess, record_id: str) -> dict[str, int]:
    record = httpx.get(f"{server.url}/reef/records/{record_id}", headers=AUTH).json()
    return record["usage"]


def test_chat_calls_and_a_report_move_the_counters_by_what_was_sent(
    server: ServerProcess,
) -> None:
    before, _ = scrape(server)
    receipts = [chat(server), chat(server), chat(server, stream=True)]
    report = {"references": receipts[:1], "score": 1.0, "report_id": "obs-report-1"}
    for _ in range(2):  # a retry under the same key stores nothing more
        response = httpx.post(
            f"{server.url}/reef/report",
            json=report,
            headers={**AUTH, "x-reef-scenario": SCENARIO},
        )
        assert response.status_code in (200, 201), response.text
    after, types = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    chat_route = {"route": "/v1/chat/completions", "status": "200", "engine": "llamacpp"}
    assert moved("reef:requests_total", **chat_route) == 3
    report_route = {"route": "/reef/report", "engine": "llamacpp"}
    assert moved("reef:requests_total", status="201", **report_route) == 1
    assert moved("reef:requests_total", status="200", **report_route) == 1
    assert moved("reef:records_stored_total", scenario=SCENARIO) == 3
    assert moved("reef:reports_stored_total", scenario=SCENARIO) == 1
    used = [usage(server, receipt) for receipt in receipts]
    prompt = sum(u["prompt_tokens"] for u in used)
    generated = sum(u["completion_tokens"] for u in used)
    assert moved("reef:prompt_tokens_total", scenario=SCENARIO) == prompt
    assert moved("reef:generation_tokens_total", scenario=SCENARIO) == generated
    assert moved("reef:e2e_request_latency_seconds_count", scenario=SCENARIO) == 3
    assert moved("reef:time_to_first_token_seconds_count", scenario=SCENARIO) == 3
    assert types["reef:e2e_request_latency_seconds"] == "histogram"
    # The store committed them in one commit or more: 5 write jobs (3 records, the report, and
    # its retry, which finds the stored report in a write transaction).
    assert moved("reef:store_group_commit_size_sum") == 5
    assert value(after, "reef:store_write_seconds_count") >= 1
    assert value(after, "reef:store_unavailable_total") == 0
    # Scrape-time figures of the engine.
    assert value(after, "reef:llamacpp_slots") >= 1
    assert value(after, "reef:num_requests_running") == 0
    assert 0 < value(after, "reef:kv_cache_usage_perc") <= 1
    assert value(after, "reef:prefix_cache_queries_total") >= prompt


def test_histograms_have_vllm_s_buckets(server: ServerProcess) -> None:
    chat(server)
    samples, _ = scrape(server)
    for name, documented in (
        ("reef:e2e_request_latency_seconds", E2E_LATENCY_BUCKETS),
        ("reef:time_to_first_token_seconds", TTFT_BUCKETS),
        ("reef:time_per_output_token_seconds", TPOT_BUCKETS),
    ):
        bounds = sorted(
            float(dict(labels)["le"])
            for sample, labels in samples
            if sample == f"{name}_bucket" and dict(labels)["scenario"] == SCENARIO
        )
        assert bounds == [*documented, float("inf")], name
    assert TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and TTFT_BUCKETS[-1] == 2560.0
    assert E2E_LATENCY_BUCKETS[0] == 0.3 and E2E_LATENCY_BUCKETS[-1] == 7680.0
    assert TPOT_BUCKETS[0] == 0.01 and TPOT_BUCKETS[-1] == 80.0


def test_a_release_switch_is_counted_and_the_head_is_an_info_metric(
    server: ServerProcess, folder: Path
) -> None:
    before, _ = scrape(server)
    assert value(before, "reef:release_switches_total", scenario=SCENARIO) == 0
    published = harness(folder / "brief", "You are brief.")
    publish = ("release", "publish", "--kind", "harness", "--approve", str(published))
    assert run_reef(folder, *publish, "--scenario", SCENARIO).returncode == 0
    deadline = time.monotonic() + 20
    while True:
        status = httpx.get(f"{server.url}/reef/status", headers=AUTH).json()
        if status["serving"].get(SCENARIO) == f"{SCENARIO}@1":
            break
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    after, types = scrape(server)
    assert value(after, "reef:release_switches_total", scenario=SCENARIO) == 1
    assert value(after, "reef:release_switch_seconds_count", scenario=SCENARIO) == 1
    head = {"scenario": SCENARIO, "release_id": f"{SCENARIO}@1", "kind": "harness"}
    assert value(after, "reef:release_head_info", **head) == 1
    assert types["reef:release_head_info"] == "gauge"  # an info metric, in the text format
    assert chat(server)  # served under the release, counted as before


def test_a_tokenless_scrape_is_refused_in_json_and_the_metrics_token_reads_only_metrics(
    server: ServerProcess,
) -> None:
    refused = httpx.get(f"{server.url}/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    wrong = httpx.get(f"{server.url}/metrics", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "invalid token" in wrong.json()["error"]["message"]
    samples, _ = scrape(server, METRICS_TOKEN)
    assert ("reef:num_requests_waiting", ()) in samples
    # The metrics token calls no model and reads no record.
    models = httpx.get(
        f"{server.url}/v1/models", headers={"authorization": f"Bearer {METRICS_TOKEN}"}
    )
    assert models.status_code == 401
    assert httpx.post(f"{server.url}/metrics", headers=AUTH).status_code == 405
    counted, _ = scrape(server)
    assert value(counted, "reef:requests_total", route="/metrics", status="401", engine="llamacpp")
