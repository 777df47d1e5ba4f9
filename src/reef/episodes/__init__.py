"""Agents judged by what they do: a task in Harbor's format (tasks.py), run by an agent
(native_agent.py, the oracle, or an installed coding agent) in a bubblewrap sandbox
(sandbox.py, relay.py) against a running Reef with a per-episode token (tokens.py), and scored by
the task's test (runner.py). See docs/episodes.md."""
