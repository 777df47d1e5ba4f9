"""The serving benchmarks' shared pieces: options and output (config.py), quiet cores (cpu.py),
load and its rounds (load.py), the servers compared (servers.py, stock_server.py), statistics
(stats.py)."""
