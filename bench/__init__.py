"""Reef's benchmarks, each run from the repository root as `python -m bench.NAME` (bench/README.md
lists them all). A benchmark with helper modules is a package (`bench/serving/`, `bench/proxy/`)
whose `__main__.py` is its command line; the others are one module each. Every benchmark writes
its figures to `bench/out/` (`bench.results.OUT`)."""
