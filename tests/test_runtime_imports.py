"""What a user's `pip install -e .` installs is all that Reef's runtime modules import.

The README's first command installs `[project] dependencies` and nothing else, then runs
`reef serve`. A module of the serving path, the CLI or the review that imports a package of the
`test` extra (as the teacher once imported jsonschema) crashes that command on a fresh machine
while every test, run with the extra installed, passes. So this test imports every Reef module in
a fresh interpreter and reads `sys.modules` afterwards: each imported package must belong to a
distribution that the dependencies bring, directly or through their own requirements.

Only the modules documented as needing an extra are left out (`EXTRA_MODULES`): they import it
when used, and say which extra to install when it is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Module prefixes documented as needing an extra, and the extra.
EXTRA_MODULES = {
    "reef.training.": "train",  # torch, peft, transformers, gguf (reef.training itself is lazy)
    "reef.testing.tiny": "train",  # torch, transformers: the tiny random model for training tests
}
NOT_IMPORTED = ["reef.__main__"]  # `python -m reef`: importing it runs the CLI

CHECKER = textwrap.dedent(
    """
    import importlib, importlib.metadata as md, json, pkgutil, re, sys

    skipped, extra_imports = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    import reef
    names = [m.name for m in pkgutil.walk_packages(reef.__path__, "reef.")]
    for name in sorted(names):
        if not any(name.startswith(prefix) for prefix in skipped):
            importlib.import_module(name)
    for name in extra_imports:
        importlib.import_module(name)
    imported = sorted(sys.modules)  # before this checker imports anything of its own

    from packaging.requirements import Requirement

    def canonical(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    def closure(distribution, extras=()):
        # The distributions that installing `distribution[extras]` brings, itself included.
        seen, todo = set(), [(distribution, tuple(extras))]
        while todo:
            name, wanted = todo.pop()
            key = (canonical(name), wanted)
            if key in seen:
                continue
            seen.add(key)
            for line in md.requires(name) or []:
                requirement = Requirement(line)
                markers = [{"extra": extra} for extra in wanted or ("",)]
                if requirement.marker and not any(
                    requirement.marker.evaluate(env) for env in markers
                ):
                    continue
                todo.append((requirement.name, tuple(sorted(requirement.extras))))
        return {name for name, _ in seen}

    allowed = closure("reef") | {"pip", "setuptools"}  # a fresh venv has both
    owners = md.packages_distributions()
    stray = {}
    for module in imported:
        top = module.partition(".")[0]
        if top in sys.stdlib_module_names or top == "reef" or top not in owners:
            continue
        distributions = {canonical(d) for d in owners[top]}
        if not distributions & allowed:
            stray[top] = sorted(distributions)
    print(json.dumps({"imported": len(names), "stray": stray}))
    """
)


def imports_outside_dependencies(extra_imports: tuple[str, ...] = ()) -> dict[str, object]:
    """Import every runtime module (and `extra_imports`) in a fresh interpreter; the packages
    imported that `dependencies` does not install, by distribution."""
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            CHECKER,
            json.dumps([*EXTRA_MODULES, *NOT_IMPORTED]),
            json.dumps(extra_imports),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["imported"] > 100  # every module of the package was walked
    return found["stray"]


def test_runtime_modules_import_only_what_the_dependencies_install() -> None:
    assert imports_outside_dependencies() == {}


def test_a_test_only_package_imported_by_a_runtime_module_is_found() -> None:
    # What the rule catches: anthropic is installed here by the `test` extra alone.
    # (and some of its own requirements, which the dependencies do not bring either).
    assert imports_outside_dependencies(("anthropic",))["anthropic"] == ["anthropic"]


def test_training_without_the_train_extra_says_which_extra_to_install() -> None:
    # `None` in sys.modules makes `import torch` fail as an uninstalled package does.
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from reef.training import MissingTrainExtra\n"
        "try:\n"
        "    from reef.sdk import train_lora\n"
        "except MissingTrainExtra as error:\n"
        "    print(error)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert "torch is not installed" in ran.stdout and "pip install 'reef[train]'" in ran.stdout
