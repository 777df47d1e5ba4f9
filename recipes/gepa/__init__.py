"""gepa: reflective prompt evolution with a Pareto front (arXiv 2507.19457)."""
