"""Learning benchmarks: whether a recipe learns what feedback asked, without forgetting; each
`python -m bench.learning.NAME`, against the base model measured in the same run."""
