"""skills: the agent's skill pool, grown by day and night (after SkillClaw)."""
