"""Reef: an OpenAI-compatible inference server that is secretly a learner."""

__version__ = "0.1.0"
