"""What every recipe that trains the served model's weights needs from its step context.

- `LoraRecipeSettings`: the LoRA settings such a recipe has, as plain settings (no torch);
- `require_weights`: the step can train (a local engine's weights);
- `served_prompt`: a turn's prompt token ids as the engine read them when it served the call (the
  record keeps them), or rendered again with the call's tools when the record has none;
- `rendered_prompt`: a conversation's prompt token ids exactly as the engine renders them under
  the current release (its harness applied), asked of the engine once per key;
- `training_length`: the tokens a training example may have (`max_length`, or the model's
  context);
- `BaseWeights`: the training base, loaded on the first step and kept by the recipe: the served
  model's weights, or the serving release's checkpoint when it has one;
- `current_adapter`: the adapter the scenario serves now, written out to keep training it;
- `train_on_current`: a training run continuing that adapter, exported (PEFT folder and llama.cpp
  GGUF) as release files, or merged into the weights it trained on as a checkpoint's files when
  the recipe's `checkpoint` setting asks for full weights (`proposal_kind` names the kind);
- `policy_update`: the RL recipes' update, its settings taken from the recipe's own.

Importing this module imports no torch: the server loads recipes too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from reef.artifacts import ADAPTER, CHECKPOINT, CHECKPOINT_FOLDER, part_of
from reef.releases.chain import read_folder
from reef.sdk.recipe import RecipeError, RecipeSettings, StepContext
from reef.sdk.view import Turn
from reef.user_cache import user_cache_dir

if TYPE_CHECKING:
    import torch

    from reef.training import Base, DistillExample, PolicyExample, TrainedAdapter

log = logging.getLogger("reef.learning")
PEFT_CONFIG = "peft/adapter_config.json"
DEFAULT_CONTEXT = 2048  # training_length for a model whose config names no context length


class LoraRecipeSettings(RecipeSettings):
    """The LoRA run of a recipe that trains weights (`reef.training.LoraSettings` by name), kept
    as plain settings so that loading the recipe in the server never imports torch. A recipe
    overrides a default by declaring the field again."""

    rank: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    learning_rate: float = Field(5e-4, gt=0)
    steps: int = Field(40, ge=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    seed: int = 0
    # Tokens per training example, the prompt cut from the left past it (an agent's prompt runs
    # to thousands of tokens); none: the model's context length.
    max_length: int | None = Field(None, ge=2)
    # Torch threads for training: "auto" times each step and uses the count that is fastest
    # lately (all the CPUs on a quiet machine, one beside a busy server: `StepThreads`); a
    # count fixes it.
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    # Training processes, data parallel (`torch.distributed`, gloo on a CPU): the same update as
    # one process, each computing a share of every batch (docs/training.md). Under torchrun, the
    # launcher's WORLD_SIZE.
    processes: int = Field(1, ge=1)
    # Propose full weights: the trained LoRA merged into the weights it trained on, a
    # `checkpoint` release (docs/releases.md), instead of the LoRA itself.
    checkpoint: bool = False


def proposal_kind(settings: RecipeSettings) -> str:
    """`checkpoint` for a recipe whose settings ask for full weights, else `lora`."""
    return "checkpoint" if getattr(settings, "checkpoint", False) else "lora"


def require_weights(context: StepContext, recipe: str) -> None:
    """Refuse a step that cannot train: no local weights. A harness at the head is no reason:
    prompts are rendered under it, and the worker's proposal keeps it (an `agent` release)."""
    if context.generate is None or context.model_path is None or context.work_dir is None:
        raise RecipeError(
            f"{recipe} trains the served model's weights: it needs the llama.cpp or vLLM engine "
            "(an upstream engine's weights are remote)"
        )


def served_prompt(context: StepContext, turn: Turn, cache: dict[str, list[int]]) -> list[int]:
    """The prompt as the engine read it when it served `turn` (harness and chat template
    applied), from the record; rendered again, with the call's tools, for a record without it."""
    if turn.prompt_token_ids:
        return list(turn.prompt_token_ids)
    return rendered_prompt(context, turn.messages, cache, turn.record_id, tools=turn.tools)


def rendered_prompt(
    context: StepContext,
    messages: list[dict[str, Any]],
    cache: dict[str, list[int]],
    key: str,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt's token ids as the engine renders `messages` for the candidate: the client's
    messages under the current release, its harness applied, as the candidate (which keeps that
    harness) will serve them; cached under `key`."""
    assert context.generate is not None
    if key not in cache:
        body: dict[str, Any] = {"messages": messages, "max_tokens": 1}
        if tools:
            body["tools"] = tools
        completion = context.generate(body)
        if not completion.prompt_token_ids:
            raise RecipeError("the engine does not report prompt token ids: training needs them")
        cache[key] = list(completion.prompt_token_ids)
    return cache[key]


class BaseWeights:
    """The weights to train on, loaded on the first step and kept while they serve: the served
    model's, or the serving release's checkpoint. Each load hashes a GGUF and checks the
    tokenizer against llama.cpp. The float32 copy of the engine's own model is cached once per
    machine (`base_cache`), that of a checkpoint under the recipe's work folder."""

    def __init__(self) -> None:
        self._loaded: Base | None = None

    def get(self, context: StepContext) -> Base:
        from reef.training import load_base

        assert context.work_dir is not None
        source = training_source(context)
        if self._loaded is None or self._loaded.source != source:
            cache = base_cache() if source == context.model_path else None
            cache = cache or context.work_dir / "base"
            self._loaded = load_base(source, cache, progress=log.info)
            forget_other_checkpoints(context.work_dir, source)
        return self._loaded


def base_cache() -> Path | None:
    """Where the float32 copies of served GGUF files are kept for every project and recipe of
    this machine: `$REEF_CACHE_DIR/bases`, else `$XDG_CACHE_HOME/reef/bases`, else
    `~/.cache/reef/bases`. Named by the file's content, so any project may share them: a
    new project's first step does not dequantise the model again (25 to 50 s for SmolLM2-135M),
    nor does each recipe keep its own copy (540 MB). None where that folder cannot be made (the
    copy then goes under the recipe's work folder)."""
    folder = user_cache_dir() / "bases"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.info(
            "cannot keep the model's float32 copy in %s (%s): keeping it per recipe", folder, error
        )
        return None
    return folder


def training_source(context: StepContext) -> Path:
    """The weights the scenario serves on: the serving release's checkpoint (written once under
    the work folder, named by its content), or the engine's model."""
    assert context.model_path is not None and context.work_dir is not None
    checkpoint = context.files_of(CHECKPOINT)
    if not checkpoint:
        return context.model_path
    digest = hashlib.sha256()
    for path in sorted(checkpoint):
        digest.update(path.encode() + b"\0" + hashlib.sha256(checkpoint[path]).digest())
    folder = context.work_dir / "checkpoints" / digest.hexdigest()[:16]
    if not folder.is_dir():
        _write_folder(folder, checkpoint)
    weights = folder / CHECKPOINT_FOLDER
    ggufs = sorted(weights.glob("*.gguf"))
    # llama.cpp serves (and the tokenizer is checked against) the GGUF; vLLM the folder.
    return ggufs[0] if ggufs and context.model_path.suffix == ".gguf" else weights


def forget_other_checkpoints(work_dir: Path, source: Path) -> None:
    """Delete the checkpoints written for training other than `source`, and the float32 copies
    of them `load_base` cached: each is the size of a model (a release's own stay in the chain).
    The engine's model and its cache are kept."""
    written = work_dir / "checkpoints"
    for folder in _subfolders(written):
        if not source.is_relative_to(folder):
            shutil.rmtree(folder, ignore_errors=True)
    for cached in _subfolders(work_dir / "base"):
        try:
            origin = Path(json.loads((cached / "reef_source.json").read_text())["gguf"])
        except (OSError, ValueError, KeyError):
            continue
        if origin.is_relative_to(written) and origin != source:
            shutil.rmtree(cached, ignore_errors=True)


def _subfolders(folder: Path) -> list[Path]:
    return [path for path in folder.iterdir() if path.is_dir()] if folder.is_dir() else []


def _write_folder(folder: Path, files: dict[str, bytes]) -> None:
    """`files` under `folder`, which appears whole or not at all."""
    partial = folder.parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        for path, data in files.items():
            (partial / path).parent.mkdir(parents=True, exist_ok=True)
            (partial / path).write_bytes(data)
        os.replace(partial, folder)
    except OSError:
        if not folder.is_dir():  # another step wrote it first: theirs is the same
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def current_adapter(context: StepContext, folder: Path) -> Path | None:
    """The adapter the scenario serves now, written into `folder` (None: start afresh)."""
    adapter = context.files_of(ADAPTER)
    if PEFT_CONFIG not in adapter:
        return None
    for path, data in adapter.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return folder


def train_on_current(
    context: StepContext,
    train: Callable[[Path | None], TrainedAdapter],
    merge_into: Base | None = None,
) -> tuple[dict[str, bytes], TrainedAdapter]:
    """`train(resume_from)` run on the current adapter, the result exported as release files:
    the adapter, or with `merge_into` (the base it trained on) the full weights with the adapter
    merged in, a checkpoint's files."""
    from reef.training import export_adapter, export_checkpoint

    with tempfile.TemporaryDirectory(prefix="reef-train-") as scratch:
        trained = train(current_adapter(context, Path(scratch) / "current"))
        if merge_into is None:
            export_adapter(trained, Path(scratch) / "adapter")
        else:
            export_checkpoint(trained, merge_into, Path(scratch) / "adapter")
        return read_folder(Path(scratch) / "adapter"), trained


def training_length(settings: RecipeSettings, base: Base) -> int:
    """The recipe's `max_length`, or the model's own context length (2048 if it names none)."""
    chosen = getattr(settings, "max_length", None)
    if chosen:
        return int(chosen)
    return int(getattr(base.model.config, "max_position_embeddings", None) or DEFAULT_CONTEXT)


def reporter(
    context: StepContext, recipe: str, what: str, steps: int
) -> Callable[[int, float], None]:
    """An `on_step(step, loss)` that logs and drives the CLI's progress bar."""

    def report(step: int, loss: float) -> None:
        log.info("%s: step %d/%d loss %.4f", recipe, step, steps, loss)
        if context.progress is not None:
            context.progress(what, step, steps, loss)

    return report


def policy_update(
    settings: RecipeSettings,
    base: Base,
    examples: list[PolicyExample],
    on_step: Callable[[int, float], None],
    resume_from: Path | None,
    **overrides: Any,
) -> TrainedAdapter:
    """`reef.training.train_policy` with every policy setting the recipe's settings share by name
    (rank, learning_rate, clip_low, kl_beta…), except the recipe's own batch_size."""
    from reef.training import PolicySettings, train_policy

    own = type(settings).model_fields
    shared = {
        name: getattr(settings, name)
        for name in PolicySettings.model_fields
        if name in own and name not in RecipeSettings.model_fields
    }
    shared["max_length"] = training_length(settings, base)
    policy = PolicySettings(**{**shared, **overrides})
    return train_policy(base, examples, policy, on_step=on_step, resume_from=resume_from)


def distill_example(
    context: StepContext,
    turn: Turn,
    teacher_messages: list[dict[str, Any]] | None,
    cache: dict[str, list[int]],
    key: str,
    weight: float = 1.0,
) -> DistillExample:
    """`turn`'s answer as served, to distil: the student reads the prompt as served, the teacher
    `teacher_messages` as the engine renders them (None: the same prompt, for a teacher that is
    another model), with the served log-probs as the behaviour policy where they are whole.
    `key` names the teacher's prompt in `cache` (one per turn and teacher context)."""
    from reef.training import DistillExample

    answer = list(turn.completion_token_ids or [])
    served = turn.completion_logprobs
    behaviour = list(served) if served and len(served) == len(answer) else None
    student = served_prompt(context, turn, cache)
    teacher = (
        student
        if teacher_messages is None
        else rendered_prompt(context, teacher_messages, cache, key, tools=turn.tools)
    )
    return DistillExample(student, teacher, answer, behaviour, weight=weight)


def distillation(
    settings: RecipeSettings,
    base: Base,
    examples: list[DistillExample],
    on_step: Callable[[int, float], None],
    resume_from: Path | None,
    teacher_model: torch.nn.Module | None = None,
    kept: TeacherKeeper | None = None,
    **overrides: Any,
) -> TrainedAdapter:
    """`reef.training.distill` with every distillation setting the recipe's settings share by
    name (rank, divergence, teacher_update_rate…), the recipe's `train_batch_size` as the batch
    and the model's context as the length, `overrides` on top; with `kept`, the EMA teacher is
    the one kept beside the adapter that serves, and is kept again for the next step."""
    from reef.training import DistillSettings
    from reef.training.distill import distill

    if kept is not None:
        overrides.setdefault("teacher_update_rate", kept.rate(settings))
    chosen = DistillSettings.shared_with(
        settings,
        batch_size=getattr(settings, "train_batch_size", 4),
        max_length=training_length(settings, base),
        **overrides,
    )
    # The data-parallel trainer keeps a teacher per rank, none across steps.
    keeping = kept is not None and chosen.processes == 1
    return distill(
        base,
        examples,
        chosen,
        on_step,
        resume_from,
        teacher_model=teacher_model,
        teacher_from=kept.start if kept and keeping else None,
        teacher_to=kept.scratch if kept and keeping else None,
    )


# Which EMA teacher a distillation recipe learns from (`teacher`): `ema`, the student's moving
# average kept across steps; `initial`, the weights the first step started from, kept frozen
# ever after; `frozen_release`, the serving release's adapter, frozen, each step anew.
KeptTeacherKind = Literal["ema", "initial", "frozen_release"]


# Teachers kept per scenario, the newest: the serving adapter's, and those of the candidates
# that may still be released or rolled back to.
KEPT_TEACHERS = 8


class TeacherKeeper:
    """Where a distillation recipe's EMA teacher lives between steps: in its work folder, beside
    the adapter it was trained with (keyed by that adapter's content), so that a step continuing
    the adapter that serves continues that adapter's teacher too; a rejected candidate's teacher
    is never the next step's. `initial` keeps the teacher it started from (rate 0);
    `frozen_release` keeps nothing (each step's teacher is the serving adapter).

    A teacher is a LoRA's factors over the weights it was trained on. A checkpoint release has
    the student's adapter merged into its weights, so a teacher kept for it would be applied on
    top of weights that already hold the student (issue 76: the teacher applied twice): none is
    kept for a checkpoint, and the next step's teacher starts from the merged weights."""

    def __init__(self, context: StepContext, kind: KeptTeacherKind) -> None:
        self.kind = kind
        self.folder = (
            None
            if context.work_dir is None or kind == "frozen_release"
            else context.work_dir / "teachers" / context.scenario
        )
        merged = _has_checkpoint(context.files)
        self.start = self._path(_parts_key(context.files)) if self.folder and not merged else None
        self.scratch = self.folder / f"training-{uuid.uuid4().hex}.pt" if self.folder else None

    def rate(self, settings: RecipeSettings) -> float:
        """The teacher's EMA rate: the recipe's for `ema`, 0 (frozen) otherwise."""
        return float(getattr(settings, "teacher_update_rate", 0.0)) if self.kind == "ema" else 0.0

    def keep(self, files: dict[str, bytes]) -> None:
        """Keep the teacher this step ended with beside the adapter it proposes (`files`), and
        only the newest `KEPT_TEACHERS` (each is an adapter's size)."""
        if self.scratch is None or not self.scratch.is_file():
            return
        if _has_checkpoint(files):  # its student is merged into these weights: no teacher over
            self.forget_scratch()
            return
        os.replace(self.scratch, self._path(_parts_key(files)))
        assert self.folder is not None
        teachers = sorted(
            (p for p in self.folder.glob("*.pt") if not p.name.startswith("training-")),
            key=lambda path: path.stat().st_mtime,
        )
        for old in teachers[:-KEPT_TEACHERS]:
            old.unlink(missing_ok=True)

    def forget_scratch(self) -> None:
        """Remove what a step that did not finish left of its teacher."""
        if self.scratch is not None:
            self.scratch.unlink(missing_ok=True)

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.pt"


def _has_checkpoint(files: dict[str, bytes]) -> bool:
    return any(part_of(path) == CHECKPOINT for path in files)


def _parts_key(files: dict[str, bytes]) -> str:
    """The content of a release's weights (its adapter and checkpoint files), as a key; `base`
    for none."""
    weights = sorted(
        (path, data) for path, data in files.items() if part_of(path) in (ADAPTER, CHECKPOINT)
    )
    if not weights:
        return "base"
    digest = hashlib.sha256()
    for path, data in weights:
        digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:32]
