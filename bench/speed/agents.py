"""A real coding agent's first session through `reef serve` as the README starts it, timed.

    .venv/bin/python -m bench.speed.agents [--agents pi,codex,claude,opencode] [--limit 60]

One server with Reef's defaults (the embedded SmolLM2-135M, llama.cpp, 4 slots of 8192 tokens,
`generation.max_tokens` auto: 1024, loops stopped) and no release: each agent is installed into
an empty HOME with `curl …/reef/harness/install?adapter=NAME | sh` (npm packages already on the
machine are used as they are) and runs one non-interactive prompt, "Say hello in one short
sentence.". The table gives each run's seconds end to end against `--limit`, and what the agent
asked of the model: its calls, the most tokens one asked for and got, and how they ended. Needs
the agents' npm packages (`.ci/run` installs them) and Node 20.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common.results import OUT
from reef.testing.processes import free_port, reef_serve

PROMPT = "Say hello in one short sentence."
RUNS = {
    "pi": ["-p", PROMPT],
    "codex": ["exec", "--skip-git-repo-check", PROMPT],
    "claude": ["-p", PROMPT],
    "opencode": ["run", PROMPT],
}
TOKEN = "bench-agents-token"


def install(url: str, adapter: str, home: Path) -> dict[str, str]:
    script = httpx.get(
        f"{url}/reef/harness/install",
        params={"adapter": adapter},
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).text
    env = {**os.environ, "HOME": str(home), "REEF_TOKEN": TOKEN}
    env["PATH"] = f"{home / '.local/bin'}:{env['PATH']}"
    subprocess.run(["sh"], input=script, text=True, env=env, check=True, capture_output=True)
    return env


def calls_of(url: str, session: str) -> list[dict]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    listed = httpx.get(
        f"{url}/reef/records", params={"order": "desc", "limit": 200}, headers=headers
    ).json()["data"]
    return [record for record in listed if record["session"] == session]


def run(url: str, adapter: str, limit: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"reef-{adapter}-") as scratch:
        home = Path(scratch)
        env = install(url, adapter, home)
        (home / "work").mkdir()
        started = time.monotonic()
        ran = subprocess.run(
            [f"reef-{adapter}", *RUNS[adapter]],
            capture_output=True,
            text=True,
            env=env,
            cwd=home / "work",
            stdin=subprocess.DEVNULL,
            timeout=max(limit * 5, 300),
        )
        seconds = time.monotonic() - started
        session = (home / f".reef/harness/{adapter}/default/last-session").read_text().strip()
    calls = calls_of(url, session)
    asked = [c["request"].get("max_tokens") or c["request"].get("max_output_tokens") for c in calls]
    return {
        "agent": adapter,
        "seconds": round(seconds, 1),
        "within_limit": seconds < limit,
        "exit": ran.returncode,
        "answer": ran.stdout.strip()[-120:],
        "calls": len(calls),
        "most_tokens_asked": max((a for a in asked if a), default=None),
        "most_tokens_generated": max((c["completion_tokens"] for c in calls), default=0),
        "finishes": sorted(
            {str((c["response"].get("choices") or [{}])[0].get("finish_reason")) for c in calls}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default=",".join(RUNS))
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a session should take")
    parser.add_argument("--json", type=Path, default=OUT / "agents.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="reef-agents-") as folder:
        server = reef_serve(Path(folder), free_port(), env={"REEF_TOKEN": TOKEN})
        with server.start():
            for adapter in args.agents.split(","):
                row = run(server.url, adapter, args.limit)
                rows.append(row)
                print(
                    f"{adapter:9} {row['seconds']:6.1f} s (limit {args.limit:.0f}: "
                    f"{'ok' if row['within_limit'] else 'OVER'}), exit {row['exit']}, "
                    f"{row['calls']} call(s), asked up to {row['most_tokens_asked']} tokens, "
                    f"generated up to {row['most_tokens_generated']}, ended {row['finishes']}",
                    flush=True,
                )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
