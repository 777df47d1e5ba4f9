"""The parts of a release's artifact, told apart by their paths.

A release carries the whole agent, or a part of it:

- the **harness**: `AGENTS.md`, `rules/`, `skills/` (with a skill's assets), `examples.jsonl`,
  `settings.json`;
- the **adapter**: a LoRA, as a llama.cpp GGUF (`*.gguf`) and/or a PEFT folder (`peft/`, or
  `adapter_config.json` with its weights at the top).

Any other file (a README, a PEFT run's `training_args.bin`) belongs to neither part: it travels
with the release, and a proposal keeps the serving release's unless it brings its own.

Its kind says which parts it has: `harness`, `lora` (an adapter alone) or `agent` (both). A recipe
that changes one part proposes a release that keeps the other as it serves now
(`keep_serving_parts`), so that a harness that made the model better and a LoRA that made it better
serve together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

HARNESS = "harness"
ADAPTER = "adapter"
OTHER = "other"  # a file of neither part
_HARNESS_FILES = ("AGENTS.md", "examples.jsonl", "settings.json")
_HARNESS_FOLDERS = ("rules", "skills")
# Kind -> the parts a release of that kind serves ("checkpoint" is not served yet).
KIND_PARTS: dict[str, tuple[str, ...]] = {
    "harness": (HARNESS,),
    "lora": (ADAPTER,),
    "agent": (HARNESS, ADAPTER),
    "checkpoint": (),
}
_ADAPTER_NAMES = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def part_of(path: str) -> str:
    """`harness`, `adapter`, or `other` for a file of neither."""
    parts = PurePosixPath(path).parts
    if path.endswith(".gguf") or parts[0] == "peft" or parts[-1] in _ADAPTER_NAMES:
        return ADAPTER
    if path in _HARNESS_FILES or (len(parts) > 1 and parts[0] in _HARNESS_FOLDERS):
        return HARNESS
    return OTHER


def parts_of(paths: Iterable[str]) -> list[str]:
    """The parts the files make up, in the order harness, adapter."""
    found = {part_of(path) for path in paths}
    return [part for part in (HARNESS, ADAPTER) if part in found]


def kind_of(parts: Iterable[str]) -> str:
    """The kind of a release holding `parts`: harness, lora, or agent for both."""
    present = set(parts)
    if present == {HARNESS, ADAPTER}:
        return "agent"
    return "lora" if present == {ADAPTER} else "harness"


def files_of(files: Mapping[str, bytes], part: str) -> dict[str, bytes]:
    """The files of one part."""
    return {path: data for path, data in files.items() if part_of(path) == part}


def keep_serving_parts(
    kind: str, files: Mapping[str, bytes], serving: Mapping[str, bytes]
) -> tuple[str, dict[str, bytes]]:
    """A proposal of one part (`harness` or `lora`) as the release it would make: its own part
    and files of neither from `files`, the other part (and files of neither it does not bring)
    as the serving release has them. (kind, files). A proposal of the whole agent (`agent`), or
    of another kind, stands as it is."""
    if kind not in ("harness", "lora"):
        return kind, dict(files)
    (part,) = KIND_PARTS[kind]
    kept = {path: data for path, data in serving.items() if part_of(path) != part}
    own = {path: data for path, data in files.items() if part_of(path) in (part, OTHER)}
    merged = {**kept, **own}
    return kind_of(parts_of(merged)), merged
