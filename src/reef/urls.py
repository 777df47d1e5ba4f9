"""URLs as Reef shows them: never with the password they may carry."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def without_password(url: str) -> str:
    """`url` with any password replaced by `***` (`postgresql://reef:***@db/reef`)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL git or libpq would read either: show its scheme alone
        return url.split("://", 1)[0] + "://***" if "://" in url else url
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
