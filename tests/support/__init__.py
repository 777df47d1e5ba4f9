"""The project's own test helpers: code the tests load by name (python scorers, a harness server)
and fixtures they share (training.py). What users' tests may import is reef.testing."""
