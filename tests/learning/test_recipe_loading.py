"""How `learning.recipe` finds a recipe: a built-in name, a project's file, an installed module,
or an entry point of the `reef.recipes` group; never by putting a folder on `sys.path`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reef.sdk.recipe import ENTRY_POINT_GROUP, Recipe, RecipeError, load_recipe
from reef.testing.processes import run_reef

RECIPE_FILE = """
from __future__ import annotations

from reef.sdk.recipe import Recipe, RecipeSettings


class MineSettings(RecipeSettings):
    threshold: float = 0.5


class Mine(Recipe):
    name = "mine"
    Settings = MineSettings
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from a folder that is not the project's, as `reef serve -c project/reef.yaml` may."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_a_projects_file_loads_relative_to_the_config_folder(
    tmp_path: Path, elsewhere: Path
) -> None:
    project = tmp_path / "project"
    write(project / "recipes/mine.py", RECIPE_FILE)
    path_before = list(sys.path)
    recipe = load_recipe("recipes/mine.py:Mine", {"threshold": 0.2}, base_dir=project)
    assert type(recipe).__name__ == "Mine" and isinstance(recipe, Recipe)
    assert recipe.settings.threshold == 0.2  # type: ignore[attr-defined]
    assert sys.path == path_before, "loading a recipe must not change sys.path"
    absolute = load_recipe(f"{project}/recipes/mine.py:Mine", {}, base_dir=elsewhere)
    assert type(absolute) is type(recipe)  # the same file is the same module


def test_a_file_in_a_package_folder_imports_its_siblings_relatively(
    tmp_path: Path, elsewhere: Path
) -> None:
    project = tmp_path / "project"
    write(project / "recipes/polite/__init__.py", "")
    write(project / "recipes/polite/helpers.py", "GREETING = 'Good day.'\n")
    write(
        project / "recipes/polite/recipe.py",
        RECIPE_FILE + "\nfrom .helpers import GREETING\n",
    )
    recipe = load_recipe("recipes/polite/recipe.py:Mine", {}, base_dir=project)
    assert sys.modules[type(recipe).__module__].GREETING == "Good day."


def test_the_scaffold_of_reef_recipe_new_loads_as_its_hint_says(tmp_path: Path) -> None:
    result = run_reef(tmp_path, "recipe", "new", "polite_answers")
    assert result.returncode == 0, result.stdout + result.stderr
    hint = "recipes/polite_answers/recipe.py:PoliteAnswers"
    assert hint in " ".join(result.stdout.split())  # rich may wrap the line
    recipe = load_recipe(hint, {"batch_size": 1}, base_dir=tmp_path)
    assert recipe.name == "polite_answers"


def test_the_scaffolds_test_passes_with_the_command_it_prints(tmp_path: Path) -> None:
    """`reef recipe new` says `test it with pytest recipes/NAME`: the pytest command, which
    (unlike `python -m pytest`) does not put the current folder on the import path."""
    assert run_reef(tmp_path, "recipe", "new", "polite_answers").returncode == 0
    pytest_command = Path(sys.executable).parent / "pytest"
    result = subprocess.run(
        [str(pytest_command), "-q", "-p", "no:cacheprovider", "recipes/polite_answers"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_the_current_folder_is_not_searched_for_modules(elsewhere: Path) -> None:
    write(elsewhere / "stray_recipes/mine.py", RECIPE_FILE)
    with pytest.raises(RecipeError, match=r"cannot import recipe module 'stray_recipes\.mine'"):
        load_recipe("stray_recipes.mine:Mine", {})
    assert str(elsewhere) not in sys.path


def test_an_installed_module_and_a_built_in_load_by_name() -> None:
    by_module = load_recipe("reef.recipes.harness_evolve.recipe:HarnessEvolve", {})
    by_name = load_recipe("harness_evolve", {})
    assert type(by_module) is type(by_name)


def test_an_entry_point_of_an_installed_package_loads_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distribution installed into a folder on the path, as pip writes one: its module and
    its dist-info with an entry point in the reef.recipes group."""
    site = tmp_path / "site-packages"
    write(site / "reef_polite_recipes/__init__.py", RECIPE_FILE)
    info = site / "reef_polite_recipes-1.0.dist-info"
    write(info / "METADATA", "Metadata-Version: 2.1\nName: reef-polite-recipes\nVersion: 1.0\n")
    write(info / "entry_points.txt", f"[{ENTRY_POINT_GROUP}]\npolite = reef_polite_recipes:Mine\n")
    monkeypatch.syspath_prepend(str(site))
    recipe = load_recipe("polite", {"threshold": 0.9})
    assert type(recipe).__module__ == "reef_polite_recipes"
    assert recipe.settings.threshold == 0.9  # type: ignore[attr-defined]


def test_bad_references_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"recipe file .*missing\.py does not exist"):
        load_recipe("recipes/missing.py:Mine", {}, base_dir=tmp_path)
    write(tmp_path / "broken.py", "import no_such_module_here\n")
    with pytest.raises(RecipeError, match=r"cannot load recipe file .*broken\.py: No module named"):
        load_recipe("broken.py:Mine", {}, base_dir=tmp_path)
    broken = str(tmp_path / "broken.py")
    assert all(getattr(module, "__file__", None) != broken for module in sys.modules.values())
    write(tmp_path / "plain.py", RECIPE_FILE)
    with pytest.raises(RecipeError, match="Nope is not a Recipe subclass"):
        load_recipe("plain.py:Nope", {}, base_dir=tmp_path)
    unknown = (
        f"neither an installed recipe \\(gepa, harness_evolve.*entry points of {ENTRY_POINT_GROUP}"
    )
    with pytest.raises(RecipeError, match=unknown):
        load_recipe("no_such_recipe", {})


def test_serve_stops_at_start_up_naming_a_missing_recipe_file(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text("learning:\n  recipe: recipes/mine.py:Mine\n")
    result = run_reef(tmp_path, "serve", "--port", "1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"recipe file {tmp_path.resolve()}/recipes/mine.py does not exist" in " ".join(
        (result.stdout + result.stderr).split()
    )
