"""What a reviewer reads and decides, without any UI: the rows and details of candidates,
releases, records and scenarios (`rows`), the reads that build them from the two stores
(`queries`), and the `ReviewSource` that serves them (`source`): from the project's stores
(`local_source`) or a server's HTTP API (`http_source`). The server's review routes call
`queries` for HTTP; the TUI (`reef.tui`) shows a source.
"""
