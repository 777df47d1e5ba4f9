"""The house's floors point one way: no import cycle among Reef's modules or packages, and an API's
room imports no other API's room; beyond `src/`, a built-in recipe imports only the SDK, and no
benchmark imports another.

Imports inside functions and under TYPE_CHECKING run late, or never, so they cannot break an
import; but they are dependencies all the same, and a cycle hidden in them is one concept spread
over two rooms. So the module graph is checked twice: the top-level imports alone, then with
every import inside a function or under TYPE_CHECKING too. An import inside a function must be of
a module in `LAZY`, where the reason it waits is written down."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
ROOMS = ("chat", "completions", "embeddings", "responses", "messages")

# What may be imported inside a function (a module or the package above it), and why it waits.
LAZY = {
    # torch, peft and transformers: the server and the CLI load them only when they train.
    "reef.training": "the train extra",
    # The engine the config names, and only that one (llama.cpp loads its shared library).
    "reef.engines.llamacpp": "an engine",
    "reef.engines.upstream": "an engine",
    "reef.engines.vllm": "an engine",
    # `reef review` only: Textual's app and the review's data sources stay out of every other
    # command's start-up.
    "reef.tui": "the review",
    "reef.review": "the review",
    # `reef serve` only: the server's loop and state stay out of every other command's start-up
    # (issue 75: each command paid a third of a second for them).
    "reef.daemon.run": "the server",
    "reef.server.state": "the server",
    # `reef export` only: the SDK's view of trajectories (numpy).
    "reef.learning.trajectories": "an export",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """The Reef modules `path` imports at its top level."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in SOURCE.rglob("*.py")}
    return {name: imported(path, name, set(paths)) for name, path in paths.items()}


def late_imports(path: Path, name: str, modules: set[str]) -> dict[str, set[str]]:
    """The Reef modules `path` imports after its top level, by where: "function" (inside a
    function's body) or "typing" (under `if TYPE_CHECKING:`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, set[str]] = {"function": set(), "typing": set()}

    def visit(node: ast.AST, where: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom) and where is not None:
                found[where] |= _targets(child, package, modules) - {name}
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, where or "function")
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, where or "typing")
            else:
                visit(child, where)

    visit(ast.parse(path.read_text()), None)
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    found = set()
    for alias in node.names:
        target = f"{base}.{alias.name}"
        found.add(target if target in modules else base)
    return {module for module in found if module in modules}


def whole_graph() -> dict[str, set[str]]:
    """Every import, wherever it is written."""
    paths = {module_name(path): path for path in SOURCE.rglob("*.py")}
    graph = import_graph()
    for name, path in paths.items():
        for targets in late_imports(path, name, set(paths)).values():
            graph[name] |= targets
    return graph


def lazy_reason(target: str) -> str | None:
    parts = target.split(".")
    return next(
        (
            LAZY[".".join(parts[:n])]
            for n in range(len(parts), 0, -1)
            if ".".join(parts[:n]) in LAZY
        ),
        None,
    )


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph`, as the nodes along it, or []."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_module_imports_itself_round_a_cycle() -> None:
    graph = import_graph()
    assert "reef.server.serving" in graph and "reef.protocol" in graph["reef.server.serving"]
    assert cycle(graph) == []


def test_no_cycle_hides_in_imports_inside_functions_or_for_types() -> None:
    graph = whole_graph()
    assert "reef.training" in graph["reef.sdk.weights"]  # a lazy import is counted
    assert cycle(graph) == []


def test_an_import_inside_a_function_is_of_a_module_that_has_a_reason_to_wait() -> None:
    paths = {module_name(path): path for path in SOURCE.rglob("*.py")}
    unexplained = {
        f"{name} -> {target}"
        for name, path in paths.items()
        for target in late_imports(path, name, set(paths))["function"]
        if lazy_reason(target) is None and not target.startswith(f"{name}.")
    }
    assert not unexplained, f"imports inside functions without a reason in LAZY: {unexplained}"


def test_no_package_imports_itself_round_a_cycle() -> None:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        packages.setdefault(package(module), set()).update(
            package(target) for target in targets if package(target) != package(module)
        )
    assert cycle(packages) == []


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return (
        parts[2] if parts[:2] == ["reef", "server"] and parts[2:3] and parts[2] in ROOMS else None
    )


def test_an_api_room_imports_no_other_api_room() -> None:
    graph = import_graph()
    assert room_of("reef.server.messages.routes") == "messages"
    assert "reef.server.serving" in graph["reef.server.messages.routes"]
    for module, targets in graph.items():
        room = room_of(module)
        if room is None:  # the app puts every room's routes together
            continue
        crossings = {target for target in targets if room_of(target) not in (None, room)}
        assert not crossings, f"{module} imports another API's room: {sorted(crossings)}"


def test_a_cycle_through_a_function_s_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def late():\n    import a\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n"
    )
    modules = {"a", "b", "c"}
    assert late_imports(tmp_path / "b.py", "b", modules) == {"function": {"a"}, "typing": set()}
    assert late_imports(tmp_path / "c.py", "c", modules) == {"function": set(), "typing": {"a"}}
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []


# The five bands of the house, top to bottom (docs/architecture.md): a package imports from its
# own band and the bands below it, never from one above.
BANDS = {
    "faces": {"__main__", "cli", "tui", "review", "server", "daemon", "testing"},
    "learning": {"learning", "sdk", "training", "harness", "recipes"},
    "releases": {"releases", "evaluation", "episodes"},
    "inference": {"engines", "inference", "client"},
    "foundations": {
        "store",
        "config",
        "errors",
        "urls",
        "yamlfile",
        "scenario",
        "artifacts",
        "threads",
        "user_cache",
        "tracing",
        "templates",
        "protocol",
    },
}
BAND_ORDER = list(BANDS)


def band_of(module: str) -> str | None:
    top = module.split(".")[1] if module.count(".") else ""
    return next((band for band, packages in BANDS.items() if top in packages), None)


def test_every_package_has_its_band() -> None:
    packages = {module.split(".")[1] for module in import_graph() if module.count(".")}
    unplaced = sorted(package for package in packages if band_of(f"reef.{package}") is None)
    assert not unplaced, f"place these in a band of BANDS (and docs/architecture.md): {unplaced}"


def test_no_band_imports_from_a_band_above_it() -> None:
    upward = set()
    for module, targets in whole_graph().items():
        band = band_of(module)
        for target in targets:
            above = band_of(target)
            if band and above and BAND_ORDER.index(above) < BAND_ORDER.index(band):
                upward.add(f"{module} ({band}) -> {target} ({above})")
    assert not upward, f"imports that climb a band: {sorted(upward)}"


def test_serving_knows_nothing_of_the_daemons() -> None:
    graph = whole_graph()
    assert any(target.startswith("reef.server") for target in graph["reef.daemon.run"])
    crossings = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("reef.server.")
        for target in targets
        if target.startswith("reef.daemon")
    }
    assert not crossings, sorted(crossings)


ROOT = SOURCE.parent


def reef_and_bench_imports(path: Path) -> set[str]:
    """Every `reef.…` and `bench.…` module a file imports, wherever it is written."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return {name for name in found if name.split(".")[0] in ("reef", "bench")}


def test_a_built_in_recipe_imports_only_the_sdk_and_its_own_folder() -> None:
    """`recipes/` (installed as `reef.recipes`) is written as a third party's recipe would be:
    against `reef.sdk`, the contract, and nothing of Reef's inside."""
    reaching = {
        f"{path.relative_to(ROOT)} -> {name}"
        for path in (ROOT / "recipes").rglob("*.py")
        for name in reef_and_bench_imports(path)
        if not (
            name == "reef.sdk"
            or name.startswith("reef.sdk.")
            or name.startswith(f"reef.recipes.{path.relative_to(ROOT / 'recipes').parts[0]}")
        )
    }
    assert not reaching, sorted(reaching)


def test_no_benchmark_imports_another() -> None:
    """A benchmark shares only `bench.common`; a benchmark that is a package (`speed/serving`)
    imports its own modules."""
    reaching = set()
    for path in (ROOT / "bench").rglob("*.py"):
        own = ".".join(path.relative_to(ROOT).parts[:3])  # bench.speed.serving, or the file
        for name in reef_and_bench_imports(path):
            allowed = name in ("bench", "bench.common") or name.startswith(("bench.common.", own))
            if name.startswith("bench") and not allowed:
                reaching.add(f"{path.relative_to(ROOT)} -> {name}")
    assert not reaching, sorted(reaching)
