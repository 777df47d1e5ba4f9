"""meta_harness: a search over whole harness trees, the proposer reading the full history."""
