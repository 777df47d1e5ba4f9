"""The proxy benchmark: `python -m bench.speed.proxy` (its command line is `__main__.py`).

`servers` starts `fake_upstream.py` and `bare_forwarder.py` by their file paths. `servers` is also
used by `bench/speed/store_backends.py` and `bench/speed/replicas.py`, `load` (the aiohttp client)
by
`bench/speed/store_backends.py`."""
