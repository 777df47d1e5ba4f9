"""URLs as Reef shows them: never with the password or token they may carry."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# A password given as a query parameter, as libpq reads it (`?password=...`).
_QUERY_PASSWORD = re.compile(r"((?:^|&)password=)[^&]*", re.IGNORECASE)


def without_password(url: str) -> str:
    """`url` with any secret replaced by `***`: the password (`postgresql://reef:***@db/reef`),
    a `password=` parameter, and the user of an http(s) URL, where tokens go
    (`https://***@github.com/org/releases.git`)."""
    try:
        parts = urlsplit(url)
        password, user = parts.password, parts.username
    except ValueError:  # not a URL git or libpq would read either: show its scheme alone
        return url.split("://", 1)[0] + "://***" if "://" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        host = netloc.rsplit("@", 1)[1]
        if parts.scheme in ("http", "https"):
            netloc = f"***@{host}"
        elif password is not None:
            netloc = f"{user or ''}:***@{host}"
    query = _QUERY_PASSWORD.sub(r"\1***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))
