"""vLLM's own metrics through Reef's `/metrics`: the child's `vllm:` families follow Reef's, read
with the child's key, and its Python process families (which Reef exports too) are left out, so
that Prometheus' parser reads one exposition without a family twice.

Real vLLM did not run here (it needs a CUDA GPU). The stand-in serves `/metrics` as vLLM does,
behind the key (Reef's guard asks for it on every path), with families named as vLLM 0.11 names
them (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:prompt_tokens_total`)."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from reef.config import load_config
from reef.engines.vllm import VLLMEngine, vllm_families
from reef.releases.workflow import ReleaseWorkflow
from reef.server.state import ServerState
from reef.store import ExperienceStore
from reef.testing.processes import free_port
from tests.engines.test_vllm import stand_in
from tests.support.in_process import serving

EXPOSITION = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 42.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
"""
METRICS = f"""
import uvicorn
from starlette.responses import JSONResponse, PlainTextResponse
from reef.testing.openai_peer import app as peer

key = os.environ.get("VLLM_API_KEY")
EXPOSITION = {EXPOSITION!r}

async def app(scope, receive, send):
    if scope["type"] == "http":
        sent = dict(scope["headers"]).get(b"authorization", b"").decode()
        if sent != f"Bearer {{key}}":  # the guard: the key on every path
            return await JSONResponse({{"error": "Unauthorized"}}, 401)(scope, receive, send)
        if scope["path"] == "/metrics":
            return await PlainTextResponse(EXPOSITION)(scope, receive, send)
    await peer(scope, receive, send)

port = int(sys.argv[sys.argv.index("--port") + 1])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def test_only_vllm_s_own_families_are_kept() -> None:
    kept = vllm_families(EXPOSITION)
    assert "python_gc" not in kept
    names = [family.name for family in text_string_to_metric_families(kept)]
    assert names == ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens"]


def test_reef_s_metrics_pass_vllm_s_through(tmp_path: Path) -> None:
    script, _ = stand_in(tmp_path, METRICS)
    engine = VLLMEngine(model="m", executable=str(script), port=free_port(), has_cuda=lambda: True)
    (tmp_path / "reef.yaml").write_text("engine:\n  kind: upstream\n")
    config = load_config(tmp_path / "reef.yaml", env={})
    with ExperienceStore(config.experience_db) as store:
        state = ServerState(config, engine, store, ReleaseWorkflow(config, store))
        with serving(state) as url:
            scraped = httpx.get(f"{url}/metrics", timeout=30)
    assert scraped.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert "reef:requests" in families  # Reef's own, then vLLM's
    (running,) = families["vllm:num_requests_running"].samples
    assert running.value == 2.0 and running.labels["model_name"] == "m"
    assert families["vllm:prompt_tokens"].samples[0].value == 1234.0
    assert scraped.text.count("# TYPE python_gc_objects_collected_total") <= 1
