"""The `reef` command line: the real commands, in process (CliRunner) or as processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI
from typer.testing import CliRunner

from reef.cli import app
from reef.evaluation.tasks import load_tasks
from reef.testing.in_process import reef_in_process
from reef.testing.processes import ServerProcess, free_port, reef_serve, run_reef
from reef.yamlfile import load_yaml
from tests.conftest import SMALL_ENGINE, TOKEN, endless, write_config

runner = CliRunner()


def reef(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.output


# -- init ---------------------------------------------------------------------------------


def test_init_scaffolds_a_project_that_serve_accepts(tmp_path: Path) -> None:
    code, output = reef("init", str(tmp_path / "proj"))
    assert code == 0, output
    project = tmp_path / "proj"
    assert (project / ".gitignore").read_text().strip().endswith(".reef/")
    assert len(load_tasks(project / "evals/default.jsonl")) > 1  # each line a valid task
    config = yaml.safe_load((project / "reef.yaml").read_text())
    assert config["server"]["port"] == 8900
    code, output = reef("serve", "-c", str(project / "reef.yaml"), "--print-config")
    assert code == 0, output


def test_init_writes_no_key_twice_and_serve_refuses_a_file_that_does(tmp_path: Path) -> None:
    code, output = reef("init", str(tmp_path / "proj"))
    assert code == 0, output
    path = tmp_path / "proj" / "reef.yaml"
    load_yaml(path.read_text(), str(path))  # raises DuplicateKey for a key set twice
    lines = path.read_text().splitlines()
    seed = next(i for i, line in enumerate(lines) if line.strip().startswith("seed:"))
    path.write_text("\n".join([*lines[: seed + 1], lines[seed], *lines[seed + 1 :]]) + "\n")
    code, output = reef("serve", "-c", str(path), "--print-config")
    assert code == 2
    assert f"line {seed + 2}: gate.seed is set twice" in " ".join(output.split())


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text("# mine\n")
    code, output = reef("init", str(tmp_path))
    assert code == 1 and "--force" in output
    assert (tmp_path / "reef.yaml").read_text() == "# mine\n"
    assert not (tmp_path / "evals").exists()
    code, _ = reef("init", str(tmp_path), "--force")
    assert code == 0 and "engine:" in (tmp_path / "reef.yaml").read_text()


# -- serve: configuration -------------------------------------------------------------------


def test_print_config_shows_flags_over_file_and_hides_secrets(tmp_path: Path) -> None:
    path = write_config(tmp_path, "server:\n  port: 9100\n  tokens: [file-secret]\n")
    code, output = reef(
        "serve",
        "-c",
        str(path),
        "--port",
        "9200",
        "--print-config",
        env={"REEF_TOKEN": "env-secret"},
    )
    assert code == 0, output
    printed = yaml.safe_load(output)
    assert printed["server"]["port"] == 9200
    assert "file-secret" not in output and "env-secret" not in output


def test_print_config_reads_back_whatever_the_length_of_its_paths(tmp_path: Path) -> None:
    deep = tmp_path / ("a-folder-with-a-long-name-" * 6) / "project"
    deep.mkdir(parents=True)
    path = write_config(deep, "server:\n  port: 9100\n")
    code, output = reef("serve", "-c", str(path), "--print-config")
    assert code == 0, output
    assert Path(yaml.safe_load(output)["state_dir"]) == deep / ".reef"  # not cut at 80 columns


def test_a_config_that_is_not_yaml_is_named_by_its_path(tmp_path: Path) -> None:
    path = write_config(tmp_path, "server:\n  port: 9100\n  tokens: [unclosed\n")
    code, output = reef("serve", "-c", str(path), "--print-config")
    assert code == 2
    assert "is not valid YAML" in output and "<unicode string>" not in output
    assert output.count(str(path)) >= 2, output  # the error and PyYAML's own mark name it


def test_a_port_in_use_is_refused_before_anything_loads(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_reef(tmp_path, "serve", "--port", str(port), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"port {port} on 127.0.0.1 is in use" in said and "--port" in said
    assert "serving on" not in said and "Errno 98" not in said  # said before the model loads


def test_client_commands_find_the_project_s_server_by_its_port(tmp_path: Path) -> None:
    """The real CLI in the project's folder, with no --url and no REEF_URL: it reads
    server.port from ./reef.yaml (and from -c elsewhere)."""
    env = {k: v for k, v in os.environ.items() if k not in ("REEF_URL", "REEF_TOKEN")}
    with reef_in_process(tmp_path) as server:
        write_config(tmp_path, f"server:\n  port: {server.config.server.port}\n")
        here = subprocess.run(
            [sys.executable, "-m", "reef", "status", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        elsewhere = subprocess.run(
            [sys.executable, "-m", "reef", "records", "-c", str(tmp_path / "reef.yaml")],
            cwd=tmp_path.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert here.returncode == 0, here.stdout + here.stderr
    assert json.loads(here.stdout)["engine"]["name"] == "scripted"
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr


def test_invalid_config_exits_2_and_names_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, "engine:\n  kind: tpu\n")
    code, output = reef("serve", "-c", str(path), "--print-config")
    assert code == 2
    assert "engine.kind" in output


def test_serving_beyond_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no REEF_TOKEN
    result = run_reef(tmp_path, "serve", "--host", "0.0.0.0", "--port", str(free_port()), env=bare)
    assert result.returncode == 2
    assert "REEF_TOKEN" in result.stderr and "127.0.0.1" in result.stderr


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    absent = str(tmp_path / "absent.gguf")
    result = run_reef(
        tmp_path, "serve", "--engine", "llamacpp", "--model", absent, "--port", str(free_port())
    )
    assert result.returncode == 1
    assert "absent.gguf does not exist" in result.stderr


def test_an_unreachable_database_at_start_is_a_clear_error_without_its_password(
    tmp_path: Path,
) -> None:
    pytest.importorskip("psycopg")
    database = f"postgresql://reef:s3cret-pw@127.0.0.1:{free_port()}/reef"
    env = {**os.environ, "REEF_STORE_URL": database}
    upstream = ("--engine", "upstream", "--upstream-url", "http://127.0.0.1:9/v1")
    result = run_reef(tmp_path, "serve", *upstream, "--port", str(free_port()), env=env)
    assert result.returncode == 1
    assert "cannot open the experience store postgresql://reef:***@127.0.0.1" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


# -- client commands against the running server ----------------------------------------------


def test_status_records_report_and_export(llama_server: ServerProcess, tmp_path: Path) -> None:
    env = {"REEF_TOKEN": TOKEN, "REEF_URL": llama_server.url}
    client = OpenAI(base_url=llama_server.url + "/v1", api_key=TOKEN, max_retries=0)
    session = {"x-reef-scenario": "cli", "x-reef-session": "cli-s1"}
    receipts = []
    history = [{"role": "user", "content": "Hello!"}]
    for follow_up in ("And again?", None):
        raw = client.chat.completions.with_raw_response.create(
            model="m",
            messages=history,
            max_tokens=6,
            extra_headers=session,  # type: ignore[arg-type]
        )
        receipts.append(raw.headers["x-reef-agent-record-id"])
        answer = raw.parse().choices[0].message.content or ""
        history = [*history, {"role": "assistant", "content": answer}]
        if follow_up:
            history.append({"role": "user", "content": follow_up})

    code, output = reef(
        "report", receipts[1], "--score", "0.5", "--feedback", "meh", "--scenario", "cli", env=env
    )
    assert code == 0, output
    assert "reported" in output

    code, output = reef("records", "--scenario", "cli", "--json", env=env)
    assert code == 0, output
    rows = json.loads(output)
    assert [r["id"] for r in rows] == receipts[::-1]
    assert rows[0]["reports"][0]["feedback"] == "meh"

    code, output = reef("records", "--scenario", "cli", env=env)
    assert code == 0 and "meh" in output and "0.5" in output
    # Piped, 80 columns: every id whole, to paste into `reef report`.
    assert all(receipt in output for receipt in receipts), output

    code, output = reef("status", env=env)
    assert code == 0 and "llamacpp" in output and "cli" in output

    out = tmp_path / "export.jsonl"
    code, output = reef("export", "--scenario", "cli", "-o", str(out), env=env)
    assert code == 0, output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1, "two calls of one session are one trajectory"
    trajectory = lines[0]
    # The last call's messages followed by its answer: the whole conversation.
    assert trajectory["messages"] == history
    assert trajectory["reef"]["record_ids"] == receipts
    assert [r["score"] for r in trajectory["reef"]["reports"]] == [0.5]


def test_client_commands_explain_a_missing_server() -> None:
    code, output = reef("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "reef serve" in output


def test_report_needs_a_score_or_feedback(llama_server: ServerProcess) -> None:
    code, output = reef("report", "rec_x", env={"REEF_URL": llama_server.url, "REEF_TOKEN": TOKEN})
    assert code == 2 and "--score" in output


def test_report_shows_the_servers_error(llama_server: ServerProcess) -> None:
    env = {"REEF_URL": llama_server.url, "REEF_TOKEN": TOKEN}
    code, output = reef("report", "rec_unknown", "--score", "1", env=env)
    assert code == 1 and "HTTP 404" in output and "rec_unknown" in output


# -- serve: graceful shutdown ---------------------------------------------------------------


@pytest.mark.e2e
def test_ctrl_c_lets_the_request_in_flight_finish(tmp_path: Path) -> None:
    write_config(tmp_path, SMALL_ENGINE)
    server = reef_serve(tmp_path, free_port(), env={"REEF_TOKEN": TOKEN}).start()
    result: dict[str, object] = {}
    started = threading.Event()

    def long_request() -> None:
        body = {
            "messages": [{"role": "user", "content": "Write a long story."}],
            # Long enough to be in flight at the signal, short enough to end within the
            # server's 60 s graceful shutdown on a loaded 2-core machine (120 tokens did not).
            "max_tokens": 48,
            "stream": True,
            **endless(),  # all 48 tokens, however the story would have ended
        }
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response:
            lines = []
            for line in response.iter_lines():
                started.set()
                lines.append(line)
            result["lines"] = lines

    thread = threading.Thread(target=long_request)
    thread.start()
    assert started.wait(30)  # the role chunk: the request is queued or running
    assert server.process is not None
    server.process.send_signal(signal.SIGINT)
    thread.join(60)
    code = server.stop()
    lines = [line for line in result["lines"] if line.startswith("data: ")]  # type: ignore[union-attr]
    assert lines[-1] == "data: [DONE]", "the stream in flight was cut off"
    assert "agent_record_id" in lines[-2]
    assert '"finish_reason":"length"' in "".join(lines).replace(" ", "")  # it ran to the end
    assert code == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/healthz")


def test_recipe_new_scaffolds_a_recipe_whose_test_passes(tmp_path: Path) -> None:
    code, output = reef("recipe", "new", "polite_answers", "--directory", str(tmp_path))
    assert code == 0, output
    folder = tmp_path / "recipes/polite_answers"
    assert {p.name for p in folder.iterdir()} >= {"__init__.py", "recipe.py", "test_recipe.py"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    code, output = reef("recipe", "new", "polite_answers", "--directory", str(tmp_path))
    assert code == 1 and "already exists" in output


def test_recipe_list_names_the_built_ins() -> None:
    code, output = reef("recipe", "list")
    assert code == 0 and "harness_evolve" in output and "harness" in output


def test_train_needs_a_recipe_in_manual_or_hybrid_mode(llama_server: ServerProcess) -> None:
    env = {"REEF_URL": llama_server.url, "REEF_TOKEN": TOKEN}
    code, output = reef("train", "answer more formally", env=env)
    assert code == 1 and "HTTP 409" in output and "learning.recipe" in output


def test_learning_progress_shows_a_bar_with_the_loss() -> None:
    from rich.console import Console
    from rich.progress import Progress

    from reef.cli.learning_commands import _progress_bars

    console = Console(record=True, width=100, force_terminal=False)
    with Progress(console=console, auto_refresh=False) as bars:
        report = _progress_bars(bars)
        report("training a LoRA", 3, 40, 1.23456)
        bars.refresh()
    task = bars.tasks[0]
    assert (task.description, task.completed, task.total) == ("training a LoRA", 3, 40)
    assert task.fields["loss"] == "loss 1.2346"


def test_a_model_file_that_is_not_a_whole_gguf_is_said_in_a_sentence(tmp_path: Path) -> None:
    """Not a GGUF (a text file), or a GGUF cut short: a sentence saying what to do, no
    traceback, and the server never says it serves."""
    (tmp_path / "notes.gguf").write_text("not a model\n")
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    for name, said in (
        ("notes.gguf", "is not a GGUF file (it starts with b'not '"),
        ("cut.gguf", "llama.cpp could not load"),
    ):
        done = run_reef(tmp_path, "serve", "--model", name, "--port", str(free_port()), timeout=60)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        assert said in output and "Traceback" not in output, output
        assert "serving on" not in output, output
