"""What a release means to serving: a `Binding` applied to every request of its scenario.

A harness artifact is a folder: `AGENTS.md` (the system prompt), `rules/*.md`,
`skills/<name>/SKILL.md`, `examples.jsonl` (worked exchanges, `{"user": ..., "assistant": ...}` per
line) and `settings.json` (default sampling settings such as temperature or max_tokens). Its
binding puts the composed system prompt and then the examples in front of the request's messages,
and fills in the settings the request leaves unset. Small models follow examples far better than
instructions, so examples are often what makes a harness change visible.

A LoRA artifact holds a llama.cpp GGUF adapter (`*.gguf`) and/or a PEFT adapter
(`adapter_config.json` and weights); its binding names the folder the engine loads it from. An
`agent` artifact holds both, and its binding applies the harness and names the adapter: the
whole agent serves as one release (`reef.artifacts`).

A checkpoint artifact holds full weights under `checkpoint/`: its binding names that folder, and
the engine serves the scenario's requests on those weights instead of the configured model's
(llama.cpp loads its GGUF beside the model it serves; vLLM reloads its weights), with the
artifact's harness and adapter, when it has them, applied as above.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reef.artifacts import ADAPTER, CHECKPOINT, HARNESS, KIND_PARTS, folder_files, parts_of
from reef.errors import ReefError, describe_validation_error
from reef.inference.routing import Routing
from reef.protocol import ChatRequest

BASE_RELEASE = "base"
# Request fields a harness's settings.json may default.
SETTINGS_FIELDS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


@dataclass(frozen=True)
class Binding:
    """The release a scenario serves, as the server applies it to each request."""

    release_id: str = BASE_RELEASE
    kind: str = "base"
    system_prompt: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    examples: tuple[tuple[str, str], ...] = ()  # (user, assistant) exchanges shown before the call
    adapter: Path | None = None  # a LoRA artifact's folder, for the engine to load
    checkpoint: Path | None = None  # a checkpoint artifact's `checkpoint/` folder: full weights
    # A release with a routing policy: the arm each call takes (`reef.inference.routing.Routing`),
    # each with its own binding; this binding's own parts serve the arms named `self`.
    routing: Routing[Binding] | None = None

    def apply(self, request: ChatRequest) -> ChatRequest:
        """The request as the engine should see it under this release."""
        if not self.system_prompt and not self.settings and not self.examples:
            return request
        update: dict[str, Any] = {
            name: value
            for name, value in self.settings.items()
            if name in SETTINGS_FIELDS and getattr(request, name) is None
        }
        messages = list(request.messages)
        if self.examples:
            messages = _with_examples(messages, self.examples)
        if self.system_prompt:
            messages = _with_system_prompt(messages, self.system_prompt)
        update["messages"] = messages
        return request.model_copy(update=update)


BASE_BINDING = Binding()


def _with_examples(messages: list[Any], examples: tuple[tuple[str, str], ...]) -> list[Any]:
    """The examples as user/assistant turns, after the leading system messages."""
    message_type = type(messages[0])
    start = 0
    while start < len(messages) and messages[start].role in ("system", "developer"):
        start += 1
    shown = [
        message_type(role=role, content=text)
        for user, assistant in examples
        for role, text in (("user", user), ("assistant", assistant))
    ]
    return [*messages[:start], *shown, *messages[start:]]


def _with_system_prompt(messages: list[Any], prompt: str) -> list[Any]:
    messages = list(messages)
    first = messages[0]
    if first.role in ("system", "developer"):
        content = first.content
        if isinstance(content, list):
            merged: Any = [{"type": "text", "text": prompt}, *content]
        else:
            merged = f"{prompt}\n\n{content}" if content else prompt
        messages[0] = first.model_copy(update={"role": "system", "content": merged})
    else:
        messages.insert(0, type(first)(role="system", content=prompt))
    return messages


def compose_system_prompt(folder: Path) -> str:
    """AGENTS.md, then each rule, then an index of the skills (name and first line)."""
    sections = []
    agents = folder / "AGENTS.md"
    if agents.is_file():
        sections.append(agents.read_text().strip())
    rules = sorted((folder / "rules").glob("*.md")) if (folder / "rules").is_dir() else []
    if rules:
        sections.append("## Rules\n\n" + "\n\n".join(rule.read_text().strip() for rule in rules))
    skills = sorted((folder / "skills").glob("*/SKILL.md")) if (folder / "skills").is_dir() else []
    if skills:
        lines = [f"- {skill.parent.name}: {_summary(skill)}" for skill in skills]
        sections.append("## Skills\n\n" + "\n".join(lines))
    return "\n\n".join(section for section in sections if section)


def _summary(skill: Path) -> str:
    for line in skill.read_text().splitlines():
        text = line.strip().lstrip("#").strip()
        if text.lower().startswith("description:"):
            return text.split(":", 1)[1].strip()
        if text and text != "---" and ":" not in text[:20]:
            return text
    return ""


def load_settings(folder: Path, strict: bool = False) -> dict[str, Any]:
    """settings.json, its values checked as a request's would be. `strict` (a new candidate)
    also refuses keys that are not SETTINGS_FIELDS; a release keeps them, and they do nothing."""
    path = folder / "settings.json"
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text())
    except ValueError as error:
        raise ReefError(f"{path} is not valid JSON: {error}", status=400) from None
    if not isinstance(settings, dict):
        raise ReefError(f"{path} must hold a JSON object", status=400)
    unknown = [key for key in settings if key not in SETTINGS_FIELDS]
    if strict and unknown:
        raise ReefError(
            f"settings.json: unknown key(s) {', '.join(map(repr, unknown))}; a harness may set "
            f"only {', '.join(SETTINGS_FIELDS)}",
            status=400,
        )
    return {**settings, **_checked_values(settings)}


def _checked_values(settings: dict[str, Any]) -> dict[str, Any]:
    """The SETTINGS_FIELDS values, validated by the request schema itself (so a harness can
    never make every request fail), as that schema reads them."""
    known = {key: value for key, value in settings.items() if key in SETTINGS_FIELDS}
    try:
        checked = ChatRequest.model_validate(
            {"messages": [{"role": "user", "content": "."}], **known}
        )
    except ValidationError as error:
        raise ReefError(f"settings.json: {describe_validation_error(error)}", status=400) from None
    return {key: getattr(checked, key) for key in known}


def load_examples(folder: Path) -> tuple[tuple[str, str], ...]:
    path = folder / "examples.jsonl"
    if not path.is_file():
        return ()
    examples = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            examples.append((str(item["user"]), str(item["assistant"])))
        except (ValueError, KeyError, TypeError):
            raise ReefError(
                f'{path}:{number}: each line must be {{"user": "...", "assistant": "..."}}',
                status=400,
            ) from None
    return tuple(examples)


def check_adapter_folder(folder: Path) -> Path:
    """A LoRA artifact needs a llama.cpp GGUF adapter or a PEFT folder (adapter_config.json)."""
    adapter_ggufs = [path for path in folder_files(folder, ADAPTER) if path.suffix == ".gguf"]
    if not adapter_ggufs and not (folder / "adapter_config.json").is_file():
        raise ReefError(
            f"LoRA artifact {folder} holds neither a .gguf adapter (llama.cpp) nor "
            "adapter_config.json (PEFT, for vLLM)",
            status=400,
        )
    return folder


def binding_for(release_id: str, kind: str, folder: Path, strict: bool = False) -> Binding:
    """Read an artifact folder (a release checkout or a candidate) into its binding: the
    harness, the adapter, or both for an `agent` release. `strict` (for a new candidate) also
    refuses settings.json keys that are not SETTINGS_FIELDS and files of a part its kind does
    not serve."""
    parts = KIND_PARTS.get(kind)
    if not parts:
        raise ReefError(f"serving {kind} releases is not supported yet", status=400)
    if strict:
        check_parts(kind, folder)
    harness = HARNESS in parts
    checkpoint = check_checkpoint_folder(folder) if CHECKPOINT in parts else None
    # Beside full weights an adapter is optional; a lora or agent release has one.
    adapter = ADAPTER in parts and (checkpoint is None or bool(folder_files(folder, ADAPTER)))
    return Binding(
        release_id=release_id,
        kind=kind,
        system_prompt=(compose_system_prompt(folder) or None) if harness else None,
        settings=load_settings(folder, strict) if harness else {},
        examples=load_examples(folder) if harness else (),
        adapter=check_adapter_folder(folder) if adapter else None,
        checkpoint=checkpoint,
    )


def check_checkpoint_folder(folder: Path) -> Path:
    """A checkpoint artifact needs full weights in `checkpoint/`: a whole-model GGUF (llama.cpp)
    or a Hugging Face model folder (config.json and its weights, vLLM)."""
    weights = folder / CHECKPOINT
    if not any(weights.glob("*.gguf")) and not (weights / "config.json").is_file():
        raise ReefError(
            f"checkpoint artifact {folder} holds neither checkpoint/*.gguf (a whole model, for "
            "llama.cpp) nor checkpoint/config.json (a Hugging Face model folder, for vLLM)",
            status=400,
        )
    return weights


def check_parts(kind: str, folder: Path) -> None:
    """A candidate of one part holds no file of the other, which would never serve."""
    paths = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    extra = [part for part in parts_of(paths) if part not in KIND_PARTS[kind]]
    if extra:
        raise ReefError(
            f"a {kind} artifact holds {' and '.join(extra)} files, which a {kind} release does "
            "not serve: publish it as kind agent (harness and adapter)",
            status=400,
        )
