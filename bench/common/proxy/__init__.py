"""The proxy benchmarks' shared pieces: a fast fake upstream, a bare forwarder as the floor,
the servers started (servers.py) and the load driven at them (load.py)."""
