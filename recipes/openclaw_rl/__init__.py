"""openclaw_rl: binary RL and hindsight distillation from each turn's next state (OpenClaw-RL)."""
