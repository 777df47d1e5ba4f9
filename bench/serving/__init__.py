"""The serving benchmark: `python -m bench.serving` (its command line is `__main__.py`).

Its helpers serve other benchmarks too: `servers` (the stock llama.cpp server, started through
`stock_server.py`, and Reef) is used by `bench/laptop.py` and `bench/batching.py`, `load` by
`bench/batching.py`, and `config.console` and `cpu` (waiting for a quiet machine) by
`bench/proxy/`."""
