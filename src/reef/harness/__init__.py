"""The harness side: rendering a scenario's harness for coding agents, and install scripts."""
