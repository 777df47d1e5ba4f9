"""Speed and memory benchmarks: serving, batching, prompts, swaps, stores, training steps;
each `python -m bench.speed.NAME`, against a baseline measured in the same run."""
