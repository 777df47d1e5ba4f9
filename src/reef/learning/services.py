"""What a recipe's step may call on the running Reef: the served model (`generate`, and under a
harness tree it tries, `generate_under`), the proposer model (`ask`), and episodes (`run_episodes`,
and under a tree, `run_episodes_under`). The worker hands these to each step's `StepContext`;
they are called from the recipe's thread and run on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import httpx

from reef.config import ReefConfig
from reef.episodes.project import project_episodes
from reef.episodes.runner import EpisodeError
from reef.episodes.tokens import trial_tree
from reef.inference.binding import Binding
from reef.inference.model import Model, answer_text
from reef.inference.trials import trial_binding, trials_folder, write_trial
from reef.protocol import ChatRequest, Completion
from reef.sdk.recipe import RecipeError

MAX_TRIALS = 256  # harness trees a recipe tried that keep their folder and binding


class RecipeServices:
    def __init__(self, config: ReefConfig, model: Model) -> None:
        self.config = config
        self.model = model  # the server's engine over loopback, or one loaded here
        self.loop: asyncio.AbstractEventLoop | None = None  # the worker's, set as a step starts
        # Harness trees recipes tried, by content: their bindings (`generate_under`), and every
        # tree written under the state folder, the episodes' too (`run_episodes_under`).
        self._trials: dict[str, Binding] = {}
        self._trial_trees: set[str] = set()

    def forget_old_trials(self) -> None:
        """Past `MAX_TRIALS` trees tried in earlier steps: start afresh."""
        if len(self._trial_trees) > MAX_TRIALS:
            self._trials.clear()
            self._trial_trees.clear()
            shutil.rmtree(trials_folder(self.config.state_dir), ignore_errors=True)

    def generate(self, body: dict[str, Any], binding: Binding) -> Completion:
        """A completion from the served model under `binding`, not recorded."""
        assert self.loop is not None
        request = ChatRequest.model_validate(body)
        running = asyncio.run_coroutine_threadsafe(self.model.complete(request, binding), self.loop)
        return running.result()

    def generate_under(
        self, files: dict[str, bytes], body: dict[str, Any], serving: Binding
    ) -> Completion:
        """A completion under a harness tree a recipe is trying, with the weights `serving`
        serves, not recorded. The tree is written once to a folder named by its content and
        read as a release's harness is."""
        digest = self._trial(files)
        binding = self._trials.get(digest)
        if binding is None:
            binding = trial_binding(self.config.state_dir, digest, serving)
            self._trials[digest] = binding
        return self.generate(body, binding)

    def run_episodes(
        self, scenario: str, tasks: str | Path, agent: str = "native", repeats: int = 1
    ) -> list[dict[str, Any]]:
        """Episodes a recipe asked for, against the server serving this state folder, under
        what `scenario` serves; one summary per episode."""
        return self._episodes(scenario, tasks, agent, repeats, "current")

    def run_episodes_under(
        self,
        scenario: str,
        files: dict[str, bytes],
        tasks: str | Path,
        agent: str = "native",
        repeats: int = 1,
    ) -> list[dict[str, Any]]:
        """The same under a harness tree a recipe's search is trying (its files), with the
        weights that serve now, not recorded: the server reads the tree from this state folder
        (`reef.inference.trials`)."""
        return self._episodes(scenario, tasks, agent, repeats, trial_tree(self._trial(files)))

    def ask(
        self,
        messages: list[dict[str, str]],
        json_schema: dict[str, Any] | None = None,
        max_tokens: int = 400,
        temperature: float = 0.7,
    ) -> str:
        """The proposer model's reply. With `json_schema`, the reply is constrained to JSON of
        that schema (a grammar on llama.cpp), so even a small model answers with something a
        recipe can parse, if `max_tokens` leaves it room to close: a reply cut short is not
        JSON. `temperature` 0 asks for its greedy reply (a judge's yes or no)."""
        body: dict[str, Any] = {
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": json_schema, "strict": True},
            }
        learning = self.config.learning
        if learning.proposer_url:
            return _ask_endpoint(
                learning.proposer_url,
                learning.proposer_model,
                learning.proposer_api_key_env,
                body,
            )
        assert self.loop is not None
        request = ChatRequest.model_validate(body)
        running = asyncio.run_coroutine_threadsafe(self.model.complete(request), self.loop)
        return answer_text(running.result())

    def _trial(self, files: dict[str, bytes]) -> str:
        digest = write_trial(self.config.state_dir, files)
        self._trial_trees.add(digest)
        return digest

    def _episodes(
        self, scenario: str, tasks: str | Path, agent: str, repeats: int, tree: str
    ) -> list[dict[str, Any]]:
        try:
            episodes = project_episodes(self.config, scenario, tasks, agent, repeats, tree)
        except EpisodeError as error:
            raise RecipeError(str(error)) from None
        return [episode.summary() for episode in episodes]


def _ask_endpoint(url: str, model: str | None, key_env: str | None, body: dict[str, Any]) -> str:
    headers = {"x-reef-capture": "false"}
    if key_env and os.environ.get(key_env):
        headers["Authorization"] = f"Bearer {os.environ[key_env]}"
    body = {"model": model or "default", **body}
    response = httpx.post(
        f"{url.rstrip('/')}/chat/completions", json=body, headers=headers, timeout=300
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"].get("content") or "")
