"""`reef review`: a Textual dashboard for candidates, releases and experience, live.

The screens talk to a `ReviewSource` (source.py) and never know whether it reads the project's
stores (local_source.py) or a server's HTTP API (http_source.py). `queries.py` holds the reads
both share: the local source calls them directly, the server's review routes call them for HTTP.
"""
