"""The recipe contract: how experience becomes candidates.

A recipe is a Python class named in the config: the name of an installed recipe (an entry point
of the `reef.recipes` group: the built-ins, `sft`, and any package's), a project's file
(`learning.recipe: recipes/mine.py:MyRecipe`) or an installed module (`package.module:Class`)
(see `recipe_class`). Authors import what they need from `reef.sdk`. It sees experience only
through an `ExperienceView` and returns a `Proposal`; it never touches HTTP, git or SQL itself.
The worker turns the proposal into a candidate, runs the gate, and records what it consumed.

    class MyRecipe(Recipe):
        name = "my_recipe"
        signal = "scores below 0.5"
        experience = "reactive, from live traffic"
        target = "harness"

        class Settings(RecipeSettings):
            threshold: float = 0.5

        def ready(self, view): ...
        def build_batch(self, view): ...
        def propose(self, batch, context): ...
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.artifacts import files_of
from reef.errors import ReefError, describe_validation_error
from reef.evaluation.held_out import HELD_OUT_PREFIX
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec
from reef.protocol import Completion
from reef.sdk.feedback import feedback_of
from reef.sdk.view import ExperienceView, Trajectory, Turn

# Installed packages offer recipes by name in this entry-point group (`learning.recipe: NAME`);
# Reef's own built-ins are entry points of it too (pyproject.toml).
ENTRY_POINT_GROUP = "reef.recipes"


class RecipeError(ReefError):
    status = 400
    code = "bad_recipe"


class ProposalRefused(Exception):
    """A recipe's proposer produced nothing usable this step (garbage, or no change): the step
    ends with no candidate and this message in the log and the status, never with a crash."""


class RecipeSettings(BaseModel):
    """Settings every recipe has; a recipe's own `Settings` subclass adds its keys."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(4, ge=1)
    # Skip records served more than this many releases before the head (None: keep all).
    max_staleness: int | None = Field(None, ge=0)


@dataclass
class Evaluated:
    """An earlier candidate of the scenario: its files and its gate score on each task."""

    candidate_id: str
    files: dict[str, bytes]
    scores: dict[str, float]


@dataclass
class StepContext:
    """What a recipe may know besides the batch when it proposes."""

    scenario: str
    release_id: str
    # The current release's artifact, every part of it (empty for base); `files_of` gives one.
    files: dict[str, bytes]
    recent_rejections: list[str] = field(default_factory=list)  # reasons, newest first
    instruction: str | None = None  # from `reef train "…"` in manual or hybrid mode
    # Sends chat messages to the proposer model (learning.proposer_*; default: the served
    # model) and returns its reply: recipes reach models through this, never HTTP directly.
    # ask(messages, json_schema=None, max_tokens=400): with a JSON schema, the reply is
    # constrained to it (leave max_tokens room for the longest reply the schema allows).
    ask: Callable[..., str] | None = None
    # Earlier candidates with their per-task scores, newest first (for population-based recipes).
    evaluated: list[Evaluated] = field(default_factory=list)
    # The proposer's context window in tokens, where Reef knows it (the served llama.cpp model's
    # `n_ctx`); None for a proposer at `learning.proposer_url` or an engine that does not say.
    proposer_context_tokens: int | None = None
    # Runs an OpenAI chat request body on the served model under the current release, without
    # recording it, and returns the Completion (text, token ids, the prompt's token ids).
    generate: Callable[[dict[str, Any]], Completion] | None = None
    # The same under a harness tree the recipe is trying instead of the current one (its files:
    # AGENTS.md, rules/, skills/, examples.jsonl, settings.json), with the weights that serve
    # now: generate_under(files, body). Search recipes (gepa) score their trees through it.
    generate_under: Callable[[dict[str, bytes], dict[str, Any]], Completion] | None = None
    # Experience a recipe goes and gets (proactive acquisition): run_episodes(tasks, agent=
    # "native", repeats=1) runs an agent on a folder of Harbor tasks (or one task) in the
    # sandbox against the running server, under what the scenario serves now; each episode's
    # calls become records and its test's result a report on them, as any traffic's. Answers
    # one summary per episode (task, reward, passed, limit, calls, report_id, ...).
    run_episodes: Callable[..., list[dict[str, Any]]] | None = None
    # The same under a harness tree the recipe is trying, with the weights that serve now, not
    # recorded: run_episodes_under(files, tasks, agent="native", repeats=1). Search recipes
    # with `episodes` set score their trees through it: what the agent does, not one answer.
    run_episodes_under: Callable[..., list[dict[str, Any]]] | None = None
    # The suite of the scenario's episode gate (`gate.episodes.tasks`), if it has one.
    episode_suite: Path | None = None
    # The served model's weights (a GGUF file or a Hugging Face folder), for recipes that train.
    model_path: Path | None = None
    # A folder the recipe may keep files in between steps (caches, scratch).
    work_dir: Path | None = None
    # Long work reports here: (what, done, total, loss or None), e.g. ("training", 3, 40, 1.9).
    progress: Callable[[str, int, int, float | None], None] | None = None
    # Keeps what the recipe concluded about a record beside it (shown by `reef records`):
    # annotate(record_id, {"score": -1, "votes": [...], "hint": "..."}).
    annotate: Callable[[str, dict[str, Any]], None] | None = None
    # The messages of the scenario's latest calls outside the batch, newest first: questions on
    # which a recipe can keep the agent answering as it does (replay against forgetting).
    anchors: list[list[dict[str, Any]]] = field(default_factory=list)
    # What the step dropped of its signal, by reason (`drop`): shown as the scenario's signal
    # yield in `reef status`, so a user sees why feedback did not reach a candidate.
    dropped: Counter[str] = field(default_factory=Counter)

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` turns or answers of the batch the step could not learn from, and why
        ("no feedback text", "no answer met the feedback", "content check", ...)."""
        if count > 0:
            self.dropped[reason] += count

    def files_of(self, part: str) -> dict[str, bytes]:
        """The current release's files of one part: `harness` (the tree a harness recipe
        mutates) or `adapter` (the LoRA a weight recipe continues)."""
        return files_of(self.files, part)


@dataclass
class Proposal:
    """A recipe's candidate. A proposal of one part (`harness`, or `lora` for an adapter) is
    released with the other part as it serves now; `agent` proposes both parts."""

    kind: str
    files: dict[str, bytes]
    reason: str
    consumed_record_ids: list[str]
    eval_tasks: list[EvalTask] = field(default_factory=list)  # run by the gate beside evals/
    # What the recipe measured while building it (e.g. {"loss": [...]}), kept on the candidate.
    metrics: dict[str, Any] = field(default_factory=dict)


def failing_prompts(
    turns: list[Turn], scorer: ScorerSpec | None, prefix: str = "failing:"
) -> list[EvalTask]:
    """The prompts of failing `turns` as eval tasks, scored by `scorer`, in the
    `FEEDBACK_GROUP`; none without a scorer. The gate judges a recipe on the held-out calls'
    (`Recipe.held_out_tasks`); a proposal's own tasks made of the prompts it learned from are
    dropped by the worker: a candidate is never judged on what it was built from."""
    if scorer is None:
        return []
    return [
        EvalTask(
            id=f"{prefix}{turn.record_id}",
            messages=turn.messages,
            scorer=scorer,
            group=FEEDBACK_GROUP,
        )
        for turn in turns
    ]


def judged_by_feedback(turns: list[Turn], prefix: str = "failing:") -> list[EvalTask]:
    """The prompts of failing `turns` the user said something about (`feedback_of`), as eval
    tasks in the `FEEDBACK_GROUP` judged by what they said (a `feedback` scorer: the gate asks
    a judge model, `reef.evaluation.judge`), each with the answer they failed."""
    return [
        EvalTask(
            id=f"{prefix}{turn.record_id}",
            messages=turn.messages,
            scorer=ScorerSpec(type="feedback", criterion=said[0], failed=turn.answer_text),
            group=FEEDBACK_GROUP,
        )
        for turn in turns
        if (said := feedback_of(turn))
    ]


class Recipe:
    name: ClassVar[str] = "recipe"
    signal: ClassVar[str] = ""
    experience: ClassVar[str] = ""
    target: ClassVar[str] = ""
    Settings: ClassVar[type[RecipeSettings]] = RecipeSettings
    # False for a recipe that makes its own experience (rollouts on a task): the worker then
    # steps it again even when no record, report or release came since it last proposed nothing.
    waits_for_traffic: ClassVar[bool] = True
    # True for a recipe that trains the served model's weights: refused at start on the
    # upstream engine, whose weights are remote.
    trains_weights: ClassVar[bool] = False
    # True for a recipe that learns from what users say in words (report texts, hints, their
    # next message): without a scorer, the gate judges its held-out calls in those words
    # (`held_out_tasks`). A recipe that learns from scores, a verifier or a teacher is not judged
    # on words it never read.
    reads_feedback_text: ClassVar[bool] = False

    def __init__(self, settings: RecipeSettings) -> None:
        self.settings = settings

    def ready(self, view: ExperienceView) -> bool:
        """True when a batch is worth a step (auto mode asks this every interval)."""
        return len(view.trajectories) >= self.settings.batch_size

    def build_batch(self, view: ExperienceView) -> list[Trajectory]:
        return view.trajectories[: self.settings.batch_size]

    def waiting_for(self, view: ExperienceView) -> str | None:
        """While not `ready`: what a batch still lacks, in words a user acts on ("1 of the 2
        failing turns a batch needs"), for the learner's waiting message; None: nothing to
        say beyond the records waiting."""
        return None

    def propose(self, batch: list[Trajectory], context: StepContext) -> Proposal | None:
        """A candidate artifact built from the batch, or None to propose nothing this step
        (raise ProposalRefused to say why)."""
        raise NotImplementedError

    def held_out_tasks(self, turns: list[Turn]) -> list[EvalTask]:
        """The gate's tasks from the held-out calls (`ExperienceView.held_out`, which no recipe
        learns from): those scored below the recipe's `threshold` (default 0.5), scored by its
        `scorer`; for a recipe without one that `reads_feedback_text`, those the user said
        something about, judged in the user's words (`judged_by_feedback`); none else."""
        scorer = getattr(self.settings, "scorer", None)
        threshold = getattr(self.settings, "threshold", 0.5)
        failing = [turn for turn in turns if turn.score is not None and turn.score < threshold]
        if scorer is None:
            if not self.reads_feedback_text:
                return []
            return judged_by_feedback(failing, prefix=HELD_OUT_PREFIX)
        return failing_prompts(failing, scorer, prefix=HELD_OUT_PREFIX)


def recipe_class(reference: str, base_dir: Path | None = None) -> type[Recipe]:
    """The class a `learning.recipe` reference names, with errors that say why.

    A reference is one of:
    - a file and a class: `recipes/mine.py:MyRecipe`, a relative path resolved against
      `base_dir` (the current folder when None; `load_config` has already made a relative
      file in reef.yaml absolute against the config's folder);
    - an installed module and a class: `package.module:MyRecipe`;
    - without a colon, the name of an installed recipe: an entry point in the `reef.recipes`
      group (`harness_evolve`, Reef's own, or a package's).
    Nothing is added to `sys.path`: a project's recipe is loaded from its file.
    """
    if ":" in reference:
        found = _load_target(reference, base_dir or Path.cwd())
    else:
        found = _load_entry_point(reference)
    if not (isinstance(found, type) and issubclass(found, Recipe)):
        raise RecipeError(f"{reference} is not a Recipe subclass (reef.sdk.Recipe)")
    return found


def installed_recipes() -> dict[str, str]:
    """Every recipe installed by name, Reef's own first: name -> the package that offers it."""
    found = {
        entry_point.name: entry_point.dist.name if entry_point.dist else ""
        for entry_point in entry_points(group=ENTRY_POINT_GROUP)
    }
    return dict(sorted(found.items(), key=lambda item: (item[1] != "reef", item[0])))


def _load_target(target: str, base_dir: Path) -> object:
    """`path/to/file.py:Class` or `package.module:Class`: the object it names, or None."""
    location, _, class_name = target.rpartition(":")
    if location.endswith(".py"):
        module = _module_from_file(base_dir / location)
    else:
        try:
            module = importlib.import_module(location)
        except Exception as error:
            raise RecipeError(f"cannot import recipe module {location!r}: {error}") from None
    return getattr(module, class_name, None)


def _module_from_file(path: Path) -> ModuleType:
    """Import a project's recipe file under a name of its own (never on `sys.path`).

    A file inside a package folder (one with `__init__.py`, as `reef recipe new` writes) is
    imported as a module of that package, so it can import its siblings relatively
    (`from .helpers import x`).
    """
    path = path.resolve()
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist")
    folder = path.parent
    if (folder / "__init__.py").is_file():
        package = _import_file(_private_name(folder), folder / "__init__.py", package=True)
        return _import_file(f"{package.__name__}.{path.stem}", path)
    return _import_file(_private_name(path), path)


def _private_name(path: Path) -> str:
    """A module name for a project's file or folder, the same for the same path."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"_reef_recipe_{digest}"


def _import_file(name: str, path: Path, package: bool = False) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    locations = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise RecipeError(f"cannot load recipe file {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as an import does
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RecipeError(f"cannot load recipe file {path}: {error}") from None
    return module


def _load_entry_point(name: str) -> object:
    """The object an installed package declares as `name` in the `reef.recipes` group."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        installed = ", ".join(installed_recipes())
        raise RecipeError(
            f"recipe {name!r} is neither an installed recipe ({installed or 'none installed'}: "
            f"entry points of {ENTRY_POINT_GROUP}), a file ('path/to/recipe.py:Class') nor a "
            "module ('package.module:Class')"
        )
    entry_point = next(iter(found))
    try:
        return entry_point.load()
    except Exception as error:
        raise RecipeError(
            f"cannot load recipe {name!r} ({entry_point.value}, entry point of "
            f"{ENTRY_POINT_GROUP}): {error}"
        ) from None


def load_recipe(reference: str, settings: dict[str, Any], base_dir: Path | None = None) -> Recipe:
    """The recipe `reference` names (see `recipe_class`), with its settings validated."""
    cls = recipe_class(reference, base_dir)
    try:
        parsed = cls.Settings.model_validate(settings)
    except ValidationError as error:
        raise RecipeError(
            f"learning settings for {cls.name}: {describe_validation_error(error)}"
        ) from None
    return cls(parsed)
