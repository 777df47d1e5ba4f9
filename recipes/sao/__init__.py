"""sao: Single-rollout Asynchronous Optimisation, and its GRPO control arm (sao_grpo)."""
