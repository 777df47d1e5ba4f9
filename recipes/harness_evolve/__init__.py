"""harness_evolve: Cordis-style harness evolution from low-scored traffic and its feedback."""
