"""The serving benchmark: `python -m bench.speed.serving` (its command line is `__main__.py`).

Its helpers serve other benchmarks too: `servers` (the stock llama.cpp server, started through
`stock_server.py`, and Reef) is used by `bench/speed/laptop.py` and `bench/speed/batching.py`,
`load` by
`bench/speed/batching.py`, and `config.console` and `cpu` (waiting for a quiet machine) by
`bench/speed/proxy/`."""
