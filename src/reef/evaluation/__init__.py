"""Evaluation: eval tasks per scenario, scorers, and paired runs of current against candidate."""
