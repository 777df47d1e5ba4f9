"""self_play: a designer proposes checkable tasks at the edge of the agent's ability."""
