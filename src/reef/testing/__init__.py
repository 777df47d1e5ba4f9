"""Helpers for testing Reef and things built on it. Not used when serving."""
