"""tttd: test-time training to discover (TTT-Discover), with a circle-packing task."""
