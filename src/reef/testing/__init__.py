"""What users' tests may import: helpers for testing Reef and things built on it (a recipe, a
client, a deployment). Not used when serving. The project's own test helpers are tests/support/.

tiny.py needs the `train` extra (torch, transformers); the rest only Reef's dependencies.
"""
