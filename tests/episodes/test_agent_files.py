"""Nothing the agent writes is trusted by the runner (issue 74): a trajectory line nested
100,000 deep raised RecursionError, `reef tasks run` died, no report was posted and the next
task never ran. Each bad line is now counted and said; the good ones are read."""

from __future__ import annotations

import json
from pathlib import Path

from reef.episodes.runner import MAX_STEP_DEPTH, parse_step, read_commands


def test_a_deep_line_is_counted_not_parsed(tmp_path: Path) -> None:
    (tmp_path / "agent").mkdir()
    good = json.dumps({"tool": "shell", "arguments": 'ls [[[ {{ \\ "'}) + "\n"
    hostile = "[" * 100_000 + "]" * 100_000 + "\n"
    deep_object = '{"a": ' + "[" * (MAX_STEP_DEPTH + 1) + "]" * (MAX_STEP_DEPTH + 1) + "}\n"
    (tmp_path / "agent" / "trajectory.jsonl").write_text(good + hostile + deep_object + "{cut")
    steps, said = read_commands(tmp_path)
    assert steps == [json.loads(good)]
    assert said == "3 line(s) of the agent's trajectory could not be read"


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    line = json.dumps({"answer": "[" * 500 + '"' + "{" * 500})
    assert parse_step(line) == json.loads(line)


def test_a_task_named_in_unicode_grants_headers_a_server_can_send() -> None:
    from reef.episodes.tokens import EpisodeGrant
    from reef.server.auth import granted_headers

    grant = EpisodeGrant("default", "ep-t-1", "tâche-任务", "current", 0.0)
    headers = dict(granted_headers([], grant))
    assert headers[b"x-reef-tag-task"] == b"t%C3%A2che-%E4%BB%BB%E5%8A%A1"
    assert headers[b"x-reef-scenario"] == b"default"


def test_defanging_a_repository_never_reaches_through_its_links(tmp_path: Path) -> None:
    """The runner defangs /app's git repositories as root: an `info` folder (or `hooks`) that
    is a link to a host folder goes as a link, and what it names stays."""
    from reef.episodes.workspace import SAFE_GIT_CONFIG, defang_git

    host = tmp_path / "host"
    host.mkdir()
    (host / "attributes").write_text("kept\n")
    (host / "pre-commit").write_text("kept\n")
    app = tmp_path / "app"
    repository = app / "src" / ".git"
    repository.mkdir(parents=True)
    (repository / "config").write_text('[core]\n\tfsmonitor = "touch /tmp/owned"\n')
    (repository / "info").symlink_to(host)
    (repository / "hooks").symlink_to(host)
    (app / "sub").mkdir()
    (app / "sub" / ".git").write_text("gitdir: /elsewhere\n")
    defang_git(app)
    assert (host / "attributes").read_text() == "kept\n"
    assert (host / "pre-commit").read_text() == "kept\n"
    assert (repository / "config").read_bytes() == SAFE_GIT_CONFIG
    assert not (repository / "info").exists() and not (repository / "hooks").is_symlink()
    assert not (app / "sub" / ".git").exists()
