"""The recipe SDK: what a learning recipe imports, all from here (`from reef.sdk import Recipe`).

The recipe world in one place: the contract is `reef.sdk.recipe` (a `Recipe` reads an
`ExperienceView` and returns a `Proposal`, which the worker gates and releases); the built-in
recipes are the top-level `recipes/` folder, installed as `reef.recipes`; `reef recipe new`
writes a project's own recipe and its test from templates/recipe/. All of them import from this
module only, so its names are the ones a recipe may rely on:

- the contract: `Recipe`, its `RecipeSettings`, the `StepContext` a step gets, the `Proposal` it
  returns, `ProposalRefused` (nothing usable this step) and `RecipeError` (a bad setting);
- experience: `ExperienceView`, its `Trajectory`s and their `Turn`s;
- evaluation: `EvalTask`, `ScorerSpec`, `ProgramScorer` (a settings field's scorer, refusing
  the gate's own `feedback` type), `score(spec, answer, task)` (an answer scored as the
  gate scores it), `FEEDBACK_GROUP` (the group of a recipe's own tasks),
  `failing_prompts` (failing prompts as eval tasks: the worker drops any a step learned from,
  and judges on the held-out calls', `Recipe.held_out_tasks`), `wrong_fact` (what a program
  can check is wrong in an answer: arithmetic),
  `Evaluated` (a candidate's scores, for recipes that search); `PromptSearch` and its
  `PromptSearchSettings`, the base of the recipes that score harness trees on a batch's scored
  prompts or, with `EpisodeSearch`, on episodes (`gepa`, `meta_harness`, `skills`), its
  `SearchTask`s, with `has_score`;
- feedback (`reef.sdk.feedback`): `hints` and `demonstrations` (what feedback said to do),
  `feedback_of` (a report's words, or else the user's next message);
- hindsight: `sound_answers` (demonstrations and well-scored answers a program finds nothing
  wrong in, each refused one counted), `relabel` (an answer that meets the feedback and
  still answers the question and keeps to facts, `facts_kept`), `with_hint`, the reasons a step
  drops signal for (`CONTENT_CHECK`, `NOTHING_MET`, `NO_FEEDBACK_TEXT`, for `StepContext.drop`),
  `asking` (the proposer model as the model that revises), `content_judge_for` (the model that
  says whether a rewrite still answers, for a recipe's `content_check`);
- weights: `LoraRecipeSettings`, `require_weights`, `BaseWeights`, `served_prompt`,
  `rendered_prompt`, `training_length`, `training_source`, `current_adapter`, `train_on_current`,
  `proposal_kind`, `policy_update`, `distill_example` and `distillation` (a served answer under a
  teacher's context, distilled with the recipe's shared settings), `TeacherKeeper` and
  `KeptTeacherKind` (where a distillation's EMA teacher is kept between steps), `reporter`;
- the weight recipes' base: `WeightRecipe` (a step's skeleton: the recipe writes `plan`,
  `train` and `summary`), its `WeightStep`, `DistillationRecipe` and its
  `DistillationSettings` (the update toward a kept teacher, for `sdft` and `sdpo`),
  `records_of` (a batch's record ids);
- messages: `message_text`, `answer_text`, `Completion`;
- harness trees: `Mutation` (one change to one file), `check_mutation` and `apply_mutation`
  (the rules every change meets, `TreeChangeRefused` naming the one broken), `EDITABLE` (the
  files a change may touch);
- artifacts: `HARNESS`, `ADAPTER` and `CHECKPOINT`, the parts a release carries
  (`StepContext.files_of(part)` gives the current release's files of one), `files_of` for any
  artifact's files;
- training (torch, the `train` extra): `TrainingExample`, `PolicyExample`, `LoraSettings`,
  `train_lora`, `distill` with its `DistillExample` and `DistillSettings` (a student pulled
  toward a teacher's distributions: the model with more context, or a separate one),
  `train_sao` with its `SAOExample` and `SAOSettings` (one scored rollout a step, with a
  critic), `load_base` (another model's weights), `load_lora`, `completion_logprobs`,
  `encode_completion`, `fit` (an example cut to a length as training cuts it), imported on
  first use,
  so that importing this module never loads torch (the server loads recipes too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reef.artifacts import ADAPTER, CHECKPOINT, HARNESS, files_of
from reef.evaluation.facts import wrong_fact
from reef.evaluation.scorers import ProgramScorer, score
from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec
from reef.harness.mutations import EDITABLE, Mutation
from reef.harness.mutations import MutationRefused as TreeChangeRefused
from reef.harness.mutations import apply as apply_mutation
from reef.harness.mutations import check as check_mutation
from reef.inference.model import answer_text
from reef.protocol import Completion, message_text
from reef.sdk.feedback import demonstrations, feedback_of, hints
from reef.sdk.hindsight import (
    CONTENT_CHECK,
    NO_FEEDBACK_TEXT,
    NOTHING_MET,
    Generate,
    Relabelled,
    asking,
    content_judge_for,
    facts_kept,
    relabel,
    sound_answers,
    with_hint,
)
from reef.sdk.prompt_search import (
    EpisodeSearch,
    PromptSearch,
    PromptSearchSettings,
    SearchTask,
    has_score,
)
from reef.sdk.recipe import (
    Evaluated,
    Proposal,
    ProposalRefused,
    Recipe,
    RecipeError,
    RecipeSettings,
    StepContext,
    failing_prompts,
)
from reef.sdk.view import ExperienceView, Trajectory, Turn
from reef.sdk.weight_recipe import (
    DistillationRecipe,
    DistillationSettings,
    WeightRecipe,
    WeightStep,
    records_of,
)
from reef.sdk.weights import (
    BaseWeights,
    KeptTeacherKind,
    LoraRecipeSettings,
    TeacherKeeper,
    current_adapter,
    distill_example,
    distillation,
    policy_update,
    proposal_kind,
    rendered_prompt,
    reporter,
    require_weights,
    served_prompt,
    train_on_current,
    training_length,
    training_source,
)
from reef.training import import_training_module

if TYPE_CHECKING:
    from reef.training import (
        DistillExample,
        DistillSettings,
        LoraSettings,
        PolicyExample,
        TrainedAdapter,
        TrainingExample,
        completion_logprobs,
        encode_completion,
        load_base,
        train_lora,
    )
    from reef.training.adapter import load_lora
    from reef.training.distill import distill
    from reef.training.loss import fit
    from reef.training.sao import SAOExample, SAOSettings, train_sao

_TRAINING = {
    "DistillExample": "reef.training",
    "DistillSettings": "reef.training",
    # The function, not its module (reef.training.distill once imported).
    "distill": "reef.training.distill",
    "LoraSettings": "reef.training",
    "PolicyExample": "reef.training",
    "TrainedAdapter": "reef.training",
    "TrainingExample": "reef.training",
    "completion_logprobs": "reef.training",
    "encode_completion": "reef.training",
    "load_base": "reef.training",
    "train_lora": "reef.training",
    "load_lora": "reef.training.adapter",
    "fit": "reef.training.loss",
    "SAOExample": "reef.training.sao",
    "SAOSettings": "reef.training.sao",
    "train_sao": "reef.training.sao",
}


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        return getattr(import_training_module(_TRAINING[name]), name)
    raise AttributeError(f"module 'reef.sdk' has no attribute {name!r}")


__all__ = [
    "ADAPTER",
    "CHECKPOINT",
    "CONTENT_CHECK",
    "EDITABLE",
    "FEEDBACK_GROUP",
    "HARNESS",
    "NOTHING_MET",
    "NO_FEEDBACK_TEXT",
    "BaseWeights",
    "Completion",
    "DistillExample",
    "DistillSettings",
    "DistillationRecipe",
    "DistillationSettings",
    "EpisodeSearch",
    "EvalTask",
    "Evaluated",
    "ExperienceView",
    "Generate",
    "KeptTeacherKind",
    "LoraRecipeSettings",
    "LoraSettings",
    "Mutation",
    "PolicyExample",
    "ProgramScorer",
    "PromptSearch",
    "PromptSearchSettings",
    "Proposal",
    "ProposalRefused",
    "Recipe",
    "RecipeError",
    "RecipeSettings",
    "Relabelled",
    "SAOExample",
    "SAOSettings",
    "ScorerSpec",
    "SearchTask",
    "StepContext",
    "TeacherKeeper",
    "TrainedAdapter",
    "TrainingExample",
    "Trajectory",
    "TreeChangeRefused",
    "Turn",
    "WeightRecipe",
    "WeightStep",
    "answer_text",
    "apply_mutation",
    "asking",
    "check_mutation",
    "completion_logprobs",
    "content_judge_for",
    "current_adapter",
    "demonstrations",
    "distill",
    "distill_example",
    "distillation",
    "encode_completion",
    "facts_kept",
    "failing_prompts",
    "feedback_of",
    "files_of",
    "fit",
    "has_score",
    "hints",
    "load_base",
    "load_lora",
    "message_text",
    "policy_update",
    "proposal_kind",
    "records_of",
    "relabel",
    "rendered_prompt",
    "reporter",
    "require_weights",
    "score",
    "served_prompt",
    "sound_answers",
    "train_lora",
    "train_on_current",
    "train_sao",
    "training_length",
    "training_source",
    "with_hint",
    "wrong_fact",
]
