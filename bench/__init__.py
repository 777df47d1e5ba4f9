"""Reef's benchmarks, each run from the repository root as `python -m bench.BAND.NAME`
(bench/README.md lists them all): `speed/` for speed and memory, `learning/` for what recipes
learn, and `common/` for what they share (no benchmark imports another). A benchmark with parts
of its own is a package (`bench/speed/serving/`, `bench/speed/proxy/`) whose `__main__.py` is its
command line. Every benchmark writes its figures to `bench/out/` (`bench.common.results.OUT`)."""
