"""Releases: the git release chain, candidates, the evaluation gate, and serving artifacts."""
