"""The house's floors point one way: no import cycle among Reef's modules or packages, and an API's
room imports no other API's room. Imports inside functions and under TYPE_CHECKING do not count:
they run late, or never."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
ROOMS = ("chat", "completions", "embeddings", "responses", "messages")


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


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
