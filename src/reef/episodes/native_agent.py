"""Reef's native agent: a loop over the OpenAI chat tools API with two tools, `shell` and
`write_file`, working in /app until the model stops calling tools or `--max-steps` is reached.

It needs only the standard library (the chat API over `urllib`), so the sandbox runs this file as
a script with the host's Python, whatever is installed beside it. Each step goes to
`--trajectory` as a JSON line (the command run, its exit code and output), which the runner
reads back as the episode's commands.

A model that cannot call tools (the embedded one with `tool_choice: auto` answers in text) may
still work through it: a fenced ```sh block in a text answer is run as a shell command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are a coding agent working in the folder /app of a Linux machine. Use the `shell` "
    "tool to run commands and the `write_file` tool to write files. When the task is done, "
    "answer with a short summary and call no tool."
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command in /app; answers its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write `content` to the file at `path` (relative to /app).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]
FENCED_SHELL = re.compile(r"```(?:sh|bash|shell)\n(.*?)```", re.DOTALL)
OUTPUT_CHARS = 4000
COMMAND_TIMEOUT_S = 120


def shell(command: str, workdir: Path) -> dict[str, Any]:
    try:
        done = subprocess.run(
            command,
            shell=True,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "output": f"timed out after {COMMAND_TIMEOUT_S} s"}
    return {"exit_code": done.returncode, "output": (done.stdout + done.stderr)[-OUTPUT_CHARS:]}


def write_file(path: str, content: str, workdir: Path) -> dict[str, Any]:
    target = (workdir / path).resolve()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    except OSError as error:
        return {"error": str(error)}
    return {"written": str(target), "bytes": len(content.encode())}


def run_tool(name: str, arguments: str, workdir: Path) -> dict[str, Any]:
    try:
        given = json.loads(arguments or "{}")
        if name == "shell":
            return shell(str(given["command"]), workdir)
        if name == "write_file":
            return write_file(str(given["path"]), str(given["content"]), workdir)
    except (ValueError, KeyError, TypeError) as error:
        return {"error": f"bad arguments for {name}: {error}"}
    return {"error": f"no tool {name!r}: use shell or write_file"}


class Trajectory:
    """Each step as a JSON line, flushed at once (a killed agent leaves its steps behind)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def add(self, **step: Any) -> None:
        self.file.write(json.dumps(step) + "\n")
        self.file.flush()


class ChatClient:
    """POST /chat/completions on an OpenAI-compatible server, one retry on a lost connection.
    OPENAI_BASE_URL and OPENAI_API_KEY (the episode's token) come from the environment."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 900.0) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout_s = timeout_s

    def complete(self, **body: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": f"Bearer {self.api_key}"},
        )
        for attempt in (1, 2):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    answer: dict[str, Any] = json.load(response)
                    return answer
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:500]
                raise SystemExit(f"the model answered {error.code}: {detail}") from None
            except (urllib.error.URLError, ConnectionError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _function_of(call: dict[str, Any]) -> tuple[str, str]:
    """A tool call's function name and arguments (a custom tool call has neither)."""
    function = call.get("function")
    if not function:
        return "", "{}"
    return str(function.get("name", "")), str(function.get("arguments") or "{}")


def run(
    client: ChatClient,
    model: str,
    instruction: str,
    workdir: Path,
    trajectory: Trajectory,
    max_steps: int,
    seed: int,
) -> int:
    """The agent's loop; returns how many steps it took."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    for step in range(1, max_steps + 1):
        answer = client.complete(
            model=model, messages=messages, tools=TOOLS, temperature=0, seed=seed
        )
        message = answer["choices"][0]["message"]
        messages.append({key: value for key, value in message.items() if value is not None})
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                name, arguments = _function_of(call)
                result = run_tool(name, arguments, workdir)
                trajectory.add(step=step, tool=name, arguments=arguments, result=result)
                messages.append(
                    {"role": "tool", "tool_call_id": call.get("id"), "content": json.dumps(result)}
                )
            continue
        content = message.get("content") or ""
        commands = FENCED_SHELL.findall(content)
        if not commands:
            trajectory.add(step=step, answer=content)
            return step
        for command in commands:
            result = shell(command, workdir)
            trajectory.add(
                step=step, tool="shell", arguments=json.dumps({"command": command}), result=result
            )
            messages.append({"role": "user", "content": f"Output:\n{json.dumps(result)}"})
    trajectory.add(step=max_steps, stopped="max_steps")
    return max_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Reef's native agent")
    parser.add_argument("--instruction", type=Path, required=True, help="a file: the task")
    parser.add_argument("--trajectory", type=Path, required=True, help="JSON lines written here")
    parser.add_argument("--workdir", type=Path, default=Path("/app"))
    parser.add_argument("--model", default=os.environ.get("REEF_MODEL", "default"))
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8900/v1")
    client = ChatClient(base_url, os.environ.get("OPENAI_API_KEY", ""))
    trajectory = Trajectory(args.trajectory)
    run(
        client,
        args.model,
        args.instruction.read_text(),
        args.workdir,
        trajectory,
        args.max_steps,
        args.seed,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
