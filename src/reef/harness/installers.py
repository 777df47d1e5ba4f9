"""Installing harness adapters: one folder per coding agent under `harness_adapters/`
(adapter.json plus an `install.sh.j2` template) that renders a scenario's current harness into a
POSIX install script.

Every value placed in a script is checked against a strict pattern first (the base URL comes
from the request's Host header), and file contents go into quoted heredocs whose delimiter is
chosen so that no content line can end them. Scripts never contain a token: they read
REEF_TOKEN when they run.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2

from reef.errors import BadRequest, NotFound, ReefError
from reef.templates import shipped_dir

# Each is checked with `.fullmatch`: `$` would let a trailing newline into the script.
ADAPTER_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SAFE_VALUE = re.compile(r"[A-Za-z0-9._:@/+-]{1,200}")
SAFE_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_./-]{0,200}")
HOST = re.compile(r"[A-Za-z0-9.:-]+")  # a name, an IPv4 or an (unbracketed) IPv6 address
PI_VERSION = "0.73"
# What each agent adapter's script installs with npm when the agent is missing: the versions
# the adapters were run against.
AGENT_PACKAGES = {
    "codex": "@openai/codex@0.171.0",
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "opencode": "opencode-ai@1.18.33",
}


class UnsafeScript(ReefError):
    """Content that would change what an install script runs, were it written into it."""

    code = "unsafe_install_script"


def adapters_dir() -> Path:
    return shipped_dir("harness_adapters")


def list_adapters() -> list[dict[str, Any]]:
    found = []
    for descriptor in sorted(adapters_dir().glob("*/adapter.json")):
        found.append(json.loads(descriptor.read_text()))
    return found


def _adapter_folder(name: str) -> Path:
    known = [a["name"] for a in list_adapters()]
    if not ADAPTER_NAME.fullmatch(name) or name not in known:
        raise NotFound(
            f"no harness adapter {name!r}; adapters: {', '.join(known)}", code="unknown_adapter"
        )
    return adapters_dir() / name


def safe_base_url(url: str) -> str:
    """scheme://host[:port] of the URL the request reached, refusing anything else."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not HOST.fullmatch(
        host if ":" not in host else f"[{host}]"
    ):
        raise BadRequest(f"cannot build an install script for the address {url!r}")
    netloc = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{netloc}" + (f":{parts.port}" if parts.port else "")


def _checked(name: str, value: str) -> str:
    if not SAFE_VALUE.fullmatch(value):
        raise BadRequest(f"{name} {value!r} cannot be written into an install script")
    return value


def _delimiter(text: str) -> str:
    """A heredoc delimiter for `text`, derived from its hash so that no line of it can be one."""
    tag = "REEF_" + hashlib.sha256(text.encode()).hexdigest()[:16].upper()
    return unused_delimiter(tag, text)


def unused_delimiter(tag: str, text: str) -> str:
    """`tag`, once sure no line of `text` equals it: such a line would end the heredoc early and
    run the rest of the text as shell commands. (A real check, not an assert: `python -O`
    strips asserts.)"""
    if tag in text.splitlines():
        raise UnsafeScript(
            f"cannot write this harness into an install script: a line of it is {tag!r}, the "
            "delimiter that ends its heredoc; change that line"
        )
    return tag


def render_install(
    adapter: str,
    *,
    base_url: str,
    scenario: str,
    release_id: str,
    model: str,
    files: dict[str, bytes],
    system_prompt: str,
    context_window: int,
    max_tokens: int = 1024,
) -> str:
    folder = _adapter_folder(adapter)
    text_files = {}
    for path, data in sorted(files.items()):
        if not SAFE_PATH.fullmatch(path) or ".." in path.split("/"):
            continue
        try:
            text = data.decode().rstrip("\n")
        except UnicodeDecodeError:
            continue  # weights and other binaries are not part of a harness tree
        text_files[path] = (text, _delimiter(text))
    env = jinja2.Environment(
        # The adapter's own folder, then the adapters folder (for `_shared/` pieces).
        loader=jinja2.FileSystemLoader([folder, adapters_dir()]),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    return env.get_template("install.sh.j2").render(
        base_url=safe_base_url(base_url),
        scenario=_checked("scenario", scenario),
        release_id=_checked("release id", release_id),
        model=_checked("model", model),
        files=text_files,
        system_prompt=system_prompt.rstrip("\n"),
        delimiter=_delimiter(system_prompt),
        context_window=int(context_window),
        max_tokens=int(max_tokens),
        pi_version=PI_VERSION,
        packages=AGENT_PACKAGES,
        adapter=adapter,
    )
