"""Reef's own API, beside the model APIs: `records` (feedback, records, status, health),
`scenarios` (creating scenarios, their contract and training mode, training instructions),
`imports` (records made elsewhere), `releases`, `review`, `harness` (the manifest, its
releases, install scripts) and `internal` (the learning worker's and the CLI's model calls).
Each module exports its `routes`."""
