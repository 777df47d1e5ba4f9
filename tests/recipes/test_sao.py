"""sao and sao_grpo: batches on a real experience store's view, the served log-probs as the
behaviour policy, one step on a tiny random llama, and the seed's config through the real CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from reef.config import load_config
from reef.learning.plans import load_plans
from reef.recipes.sao.recipe import SAOGRPO, SAORecipe, SAOSettings, release_number
from reef.sdk.recipe import RecipeError, StepContext
from reef.sdk.view import ExperienceView, Turn
from reef.store import ExperienceStore, Record, Report

SEEDS = itertools.count()
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "recipes/sao/examples/sao/serve.yaml"


def rollout(
    store: ExperienceStore,
    release: int,
    score: float | None,
    question: str = "What is 2 + 3?",
    tokens: int = 3,
) -> str:
    """A served call (its token ids and served log-probs recorded), scored if `score` is set.
    Each has a seed of its own: identical requests would count once, as retries."""
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": question}], "seed": next(SEEDS)},
        response={"choices": [{"message": {"role": "assistant", "content": "5"}}]},
        engine="test",
        release_id=f"default@{release}" if release else "base",
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=list(range(10, 10 + tokens)),
        completion_logprobs=[-0.5] * tokens,
    )
    record_id = store.add_record(record).result()
    if score is not None:
        store.add_report(Report("default", [record_id], score=score)).result()
    return record_id


def view(store: ExperienceStore, consumed: set[str], head: int, staleness: int | None) -> Any:
    return ExperienceView(store, "default", consumed, head_number=head, max_staleness=staleness)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = ExperienceStore(tmp_path / "experience.db")
    yield opened
    opened.close()


def test_with_batch_size_1_every_scored_report_becomes_one_step(store: ExperienceStore) -> None:
    recipe = SAORecipe(SAOSettings())  # batch_size 1, max_staleness 18: as the seed writes them
    served = [rollout(store, 0, 1.0 if i % 3 else 0.0, f"q{i}") for i in range(18)]
    rollout(store, 0, None, "unscored")  # no report: never a step
    consumed: set[str] = set()
    steps = []
    head = 0
    while True:
        seen = view(store, consumed, head, recipe.settings.max_staleness)
        assert seen.counts.stale_skipped == 0
        if not recipe.ready(seen):
            break
        batch = recipe.build_batch(seen)
        rollouts = recipe.rollouts(batch)
        assert len(rollouts) == 1 and rollouts[0][1] is None  # one rollout, the critic's baseline
        steps.append(rollouts[0][0].record_id)
        consumed.add(rollouts[0][0].record_id)  # the step's candidate consumed it
        head += 1  # and its release serves the next request
    assert steps == served  # all 18, in the order they were scored, none dropped as stale


def test_a_stale_record_is_dropped_and_counted(store: ExperienceStore) -> None:
    recipe = SAORecipe(SAOSettings(max_staleness=18))
    old = rollout(store, 1, 1.0, "old")
    fresh = rollout(store, 2, 0.0, "fresh")
    seen = view(store, set(), 20, recipe.settings.max_staleness)  # old lags 19, fresh 18
    assert recipe.ready(seen)
    assert seen.counts.stale_skipped == 1
    assert [t.record_id for t in seen.turns()] == [fresh]
    assert old not in {t.record_id for t in recipe.build_batch(seen)[0].turns}
    assert recipe._stale == 1  # reported as the step's stale_dropped


def test_the_grpo_control_waits_for_a_group_and_takes_score_minus_the_group_mean(
    store: ExperienceStore,
) -> None:
    recipe = SAOGRPO(SAOGRPO.Settings(group_size=3))
    for score in (1.0, 0.0):
        rollout(store, 0, score, "What is 2 + 3?")
    rollout(store, 0, 1.0, "Another")
    assert not recipe.ready(view(store, set(), 0, None))  # no barrier passed yet
    for score in (1.0, 1.0, 1.0):
        rollout(store, 0, score, "Another")  # a full group, but every score equal: no signal
    assert not recipe.ready(view(store, set(), 0, None))
    rollout(store, 0, 1.0, "What is 2 + 3?")
    seen = view(store, set(), 0, None)
    assert recipe.ready(seen)
    advantages = [a for _, a in recipe.rollouts(recipe.build_batch(seen))]
    mean = 2.0 / 3.0
    assert advantages == pytest.approx([1.0 - mean, 0.0 - mean, 1.0 - mean])


def test_the_policy_lag_counts_releases_between_serving_and_the_head() -> None:
    assert (release_number("base"), release_number("default@7")) == (0, 7)


# -- the update on a tiny model --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch")
    from reef.testing.tiny import tiny_model_folder

    return tiny_model_folder(tmp_path_factory.mktemp("tiny"))


def served_turn(base: Any, behaviour: list[float] | None = None, score: float = 1.0) -> Turn:
    """A turn whose served log-probs are the tiny model's own (or `behaviour`)."""
    from reef.training import completion_logprobs

    prompt = base.tokenizer("<|im_start|>user\nHi<|im_end|>\n")["input_ids"]
    completion = base.tokenizer("Hello")["input_ids"]
    own = completion_logprobs(base.model, prompt, completion)
    return Turn(
        record_id="rec_1",
        messages=[{"role": "user", "content": "Hi"}],
        answer={"role": "assistant", "content": "Hello"},
        release_id="default@2",
        reports=[{"score": score, "created_at": 0.0}],
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=own if behaviour is None else behaviour,
    )


def context(tiny: Path, work_dir: Path) -> StepContext:
    def no_render(body: dict[str, Any]) -> Any:
        raise AssertionError("the record's prompt ids are used, never rendered again")

    return StepContext(
        scenario="default",
        release_id="default@5",
        files={},
        generate=no_render,
        model_path=tiny,
        work_dir=work_dir,
    )


def test_the_sample_uses_the_recorded_log_probs_and_changing_them_changes_the_ratio(
    tiny: Path, tmp_path: Path
) -> None:
    from reef.training import load_base
    from reef.training.sao import SAOSettings as UpdateSettings
    from reef.training.sao import train_sao

    base = load_base(tiny, tmp_path / "cache")
    recipe = SAORecipe(SAOSettings())
    on_policy = served_turn(base)
    (example,) = recipe.examples([(on_policy, None)], context(tiny, tmp_path))
    assert example.behaviour_logprobs == on_policy.completion_logprobs  # as recorded
    settings = UpdateSettings(critic_steps=0)
    same = train_sao(base, [example], settings, tmp_path / "a.pt").metrics
    assert same["clip_fraction"] == [0.0]  # r = 1 on every token: inside the range
    # The record says the engine gave each token e^2 times less probability: r = 7.4, above the
    # paper's ceiling 1 + 5.0.
    shifted = served_turn(base, [lp - 2.0 for lp in on_policy.completion_logprobs or []])
    (moved,) = recipe.examples([(shifted, None)], context(tiny, tmp_path))
    other = train_sao(base, [moved], settings, tmp_path / "b.pt").metrics
    assert other["clip_fraction"] == [1.0] and other["loss"] == [0.0]
    assert other["actor_grad_norm"] == [0.0]  # every token masked: no gradient at all


def test_one_scored_rollout_is_one_proposed_step_with_its_telemetry(
    tiny: Path, tmp_path: Path
) -> None:
    from reef.training import load_base

    recipe = SAORecipe(SAOSettings(critic_steps=2))
    turn = served_turn(load_base(tiny, tmp_path / "cache"))
    from reef.sdk.view import Trajectory

    proposal = recipe.propose([Trajectory("t", [turn])], context(tiny, tmp_path / "work"))
    assert proposal is not None
    assert proposal.kind == "lora" and proposal.consumed_record_ids == ["rec_1"]
    assert "peft/adapter_config.json" in proposal.files
    metrics = proposal.metrics
    assert len(metrics["loss"]) == 1 and metrics["rollouts"] == 1  # one optimiser step
    assert metrics["policy_lag_max"] == 3  # served by release 2, trained on the head, 5
    assert metrics["queue_age_s_max"] > 0
    assert len(metrics["critic_loss"]) == 2 and len(metrics["critic_grad_norm"]) == 2
    assert metrics["critic_loss"][1] < metrics["critic_loss"][0]  # the critic learns the score
    assert set(metrics) >= {"clip_fraction", "actor_grad_norm", "critic_explained_variance"}
    assert (tmp_path / "work/critic/default.pt").is_file()  # kept for the next step
    json.dumps(metrics, allow_nan=False)  # kept on the candidate, served as strict JSON


# -- the seed's configuration ----------------------------------------------------------------


def test_the_seed_config_prints_through_the_real_cli_as_its_learning_block() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "reef", "serve", "-c", str(EXAMPLE), "--print-config"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    learning = yaml.safe_load(printed)["learning"]
    assert learning["recipe"] == f"{ROOT}/recipes/sao/recipe.py:SAORecipe"  # the project's file
    assert (learning["batch_size"], learning["max_staleness"]) == (1, 18)
    (plan,) = load_plans(load_config(EXAMPLE))
    (recipe,) = plan.recipes
    assert recipe.name == "sao" and recipe.settings.batch_size == 1


def test_a_reef_block_refuses_an_unknown_setting_naming_the_recipe_and_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "reef.yaml").write_text("reef:\n  recipe: sao\n  batchsize: 1\n")
    with pytest.raises(RecipeError, match=r"^reef \(scenario default\).*sao: batchsize: unknown"):
        load_plans(load_config(tmp_path / "reef.yaml", env={}))


def test_print_config_refuses_a_misspelt_recipe_setting_as_serve_would(tmp_path: Path) -> None:
    """The source document's `reef:` block with `max_stalenes`: the real CLI's --print-config
    checks the recipe's settings too, not only the schema around them."""
    (tmp_path / "serve.yaml").write_text(
        "reef:\n  recipe: recipes.sao.recipe:SAORecipe\n  max_stalenes: 3\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "reef", "serve", "-c", "serve.yaml", "--print-config"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "max_stalenes" in result.stderr and "unknown" in result.stderr


def test_reef_and_learning_together_or_a_reef_block_without_recipe_are_refused(
    tmp_path: Path,
) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("reef:\n  recipe: sao\nlearning:\n  recipe: sft\n")
    result = subprocess.run(
        [sys.executable, "-m", "reef", "serve", "-c", str(both), "--print-config"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "reef and learning both" in result.stdout + result.stderr
    bare = tmp_path / "bare.yaml"
    bare.write_text("reef:\n  batch_size: 1\n")
    with pytest.raises(ValueError, match="reef: needs recipe"):
        load_config(bare, env={})


def test_a_recipes_module_outside_a_checkout_is_reefs_installed_recipe(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")  # a project of its own, without recipes/sao
    (tmp_path / "serve.yaml").write_text("reef:\n  recipe: recipes.sao.recipe:SAORecipe\n")
    config = load_config(tmp_path / "serve.yaml", env={})
    assert config.learning.recipe == "reef.recipes.sao.recipe:SAORecipe"  # as the wheel installs
    assert load_plans(config)[0].recipes[0].name == "sao"


def test_the_defaults_are_the_paper_s_and_every_token_of_a_short_answer_learns() -> None:
    """alpha 0.05 gave lambda 0 to answers of 20 tokens or fewer: with a fresh critic only the
    last token had an advantage. The paper's alpha 1.5 spreads the score over all eight."""
    from reef.training.sao import SAOSettings as UpdateSettings
    from reef.training.value import gae, length_adaptive_lambda, terminal_rewards

    settings = UpdateSettings()
    assert (settings.length_alpha, settings.eps_clip, settings.eps_clip_high) == (1.5, 0.3, 5.0)
    assert SAOSettings().length_alpha == settings.length_alpha  # the recipe's, the same
    fresh_critic = [0.5] * 8  # a value head that has learned nothing predicts about the mean
    for alpha, learning in ((0.05, 1), (settings.length_alpha, 8)):
        lam = length_adaptive_lambda(8, alpha)
        advantages, _ = gae(terminal_rewards(1.0, 8), fresh_critic, 1.0, lam)
        assert sum(abs(a) > 1e-6 for a in advantages) == learning, (alpha, advantages)
