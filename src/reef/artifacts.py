"""The parts of a release's artifact, told apart by their paths.

A release carries the whole agent, or a part of it:

- the **harness**: `AGENTS.md`, `rules/`, `skills/` (with a skill's assets), `examples.jsonl`,
  `settings.json`;
- the **adapter**: a LoRA, as a llama.cpp GGUF (`*.gguf`) and/or a PEFT folder (`peft/`, or
  `adapter_config.json` with its weights at the top);
- the **checkpoint**: full weights under `checkpoint/`, a whole-model GGUF (`checkpoint/*.gguf`,
  llama.cpp) and/or a Hugging Face model folder (`checkpoint/config.json` with its safetensors,
  vLLM). They replace the served model's weights; an adapter beside them applies to them;
- the **routing** policy: `routing.yaml`, which release serves which share of sessions
  (`reef.inference.routing`). Any kind may carry one; a proposal never keeps the serving one.

Any other file (a README, a PEFT run's `training_args.bin`) belongs to neither part: it travels
with the release, and a proposal keeps the serving release's unless it brings its own.

Its kind says which parts it has: `harness`, `lora` (an adapter alone), `agent` (both), or
`checkpoint` (full weights, with a harness and an adapter or without). A recipe that changes one
part proposes a release that keeps the others as they serve now (`keep_serving_parts`), so that a
harness that made the model better and a LoRA that made it better serve together. A checkpoint
proposal keeps the serving harness and drops the serving adapter: a recipe that makes full weights
trains on the serving release's, adapter included, and merges it in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

HARNESS = "harness"
ADAPTER = "adapter"
CHECKPOINT = "checkpoint"
ROUTING = "routing"
OTHER = "other"  # a file of none of the parts
PARTS = (HARNESS, ADAPTER, CHECKPOINT, ROUTING)
CHECKPOINT_FOLDER = "checkpoint"
ROUTING_FILE = "routing.yaml"
_HARNESS_FILES = ("AGENTS.md", "examples.jsonl", "settings.json")
_HARNESS_FOLDERS = ("rules", "skills")
# Kind -> the parts a release of that kind may serve.
KIND_PARTS: dict[str, tuple[str, ...]] = {
    "harness": (HARNESS, ROUTING),
    "lora": (ADAPTER, ROUTING),
    "agent": (HARNESS, ADAPTER, ROUTING),
    "checkpoint": (HARNESS, ADAPTER, CHECKPOINT, ROUTING),
}
_ADAPTER_NAMES = (
    "adapter_config.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def part_of(path: str) -> str:
    """`harness`, `adapter`, `checkpoint`, or `other` for a file of none of them."""
    parts = PurePosixPath(path).parts
    if len(parts) > 1 and parts[0] == CHECKPOINT_FOLDER:
        return CHECKPOINT
    if path == ROUTING_FILE:
        return ROUTING
    if path.endswith(".gguf") or parts[0] == "peft" or parts[-1] in _ADAPTER_NAMES:
        return ADAPTER
    if path in _HARNESS_FILES or (len(parts) > 1 and parts[0] in _HARNESS_FOLDERS):
        return HARNESS
    return OTHER


def parts_of(paths: Iterable[str]) -> list[str]:
    """The parts the files make up, in the order harness, adapter, checkpoint."""
    found = {part_of(path) for path in paths}
    return [part for part in PARTS if part in found]


def kind_of(parts: Iterable[str]) -> str:
    """The kind of a release holding `parts`: checkpoint when it holds full weights, else
    harness, lora, or agent for both."""
    present = set(parts) - {ROUTING}  # a policy does not change what the release is
    if CHECKPOINT in present:
        return "checkpoint"
    if present == {HARNESS, ADAPTER}:
        return "agent"
    return "lora" if present == {ADAPTER} else "harness"


def folder_files(folder: Path, part: str) -> list[Path]:
    """The files of one part in an artifact folder (a candidate or a release checkout), sorted."""
    found = (path for path in folder.rglob("*") if path.is_file())
    return sorted(path for path in found if part_of(path.relative_to(folder).as_posix()) == part)


def files_of(files: Mapping[str, bytes], part: str) -> dict[str, bytes]:
    """The files of one part."""
    return {path: data for path, data in files.items() if part_of(path) == part}


# A proposal of this kind -> the serving parts it replaces (and so never keeps).
# The serving routing policy is never kept: it routed between releases the proposal replaces.
_REPLACES = {
    "harness": (HARNESS, ROUTING),
    "lora": (ADAPTER, ROUTING),
    "agent": (HARNESS, ADAPTER, ROUTING),  # the agent on the weights that serve
    "checkpoint": (ADAPTER, CHECKPOINT, ROUTING),  # the serving adapter is merged in
}


def keep_serving_parts(
    kind: str, files: Mapping[str, bytes], serving: Mapping[str, bytes]
) -> tuple[str, dict[str, bytes]]:
    """A proposal (`harness`, `lora`, `agent`, `checkpoint`) as the release it would make: its
    own files, and the serving release's files of the parts it does not replace (and files of
    none it does not bring). (kind, files). A proposal of an unknown kind stands as it is."""
    replaced = _REPLACES.get(kind)
    if replaced is None:
        return kind, dict(files)
    kept = {path: data for path, data in serving.items() if part_of(path) not in replaced}
    own_parts = (*KIND_PARTS[kind], OTHER)
    own = {path: data for path, data in files.items() if part_of(path) in own_parts}
    merged = {**kept, **own}
    return kind_of(parts_of(merged)), merged


def rebased(
    files: Mapping[str, bytes], base: Mapping[str, bytes], head: Mapping[str, bytes]
) -> tuple[str, dict[str, bytes]]:
    """A candidate's `files`, built on release `base`, moved onto release `head`: each part it
    changed from `base` as it made it, each part it left alone as `head` serves it. (kind,
    files)."""
    merged: dict[str, bytes] = {}
    for part in (*PARTS, OTHER):
        own = files_of(files, part)
        merged.update(own if own != files_of(base, part) else files_of(head, part))
    return kind_of(parts_of(merged)), merged
