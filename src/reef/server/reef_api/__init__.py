"""Reef's own API, beside the model APIs: `records` (feedback, records, status, training
instructions, health), `releases`, `review`, `harness` (install scripts) and `internal` (the
learning worker's and the CLI's model calls). Each module exports its `routes`."""
