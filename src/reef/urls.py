"""URLs as Reef shows them: never with the password or token they may carry."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

# A query parameter whose name says it holds a secret: libpq's `password=`, `?api_key=`,
# `access_token=`, a signed URL's `X-Amz-Signature=` or `sig=`, and the like.
_SECRET_NAME = re.compile(
    r"key|token|secret|pass(?:word|wd)?|pwd|auth|credential|signature|^sig$", re.IGNORECASE
)
_QUERY_PART = re.compile(r"([^&=;]*)(=)([^&;]*)")


def _is_secret_name(name: str) -> bool:
    return _SECRET_NAME.search(unquote(name)) is not None


def without_password(url: str) -> str:
    """`url` with any secret replaced by `***`: the password (`postgresql://reef:***@db/reef`),
    the user of an http(s) URL, where tokens go (`https://***@github.com/org/releases.git`), and
    each query parameter named like a secret (`?api_key=***`, `?password=***`)."""
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
    query = _QUERY_PART.sub(
        lambda m: m.group(0) if not _is_secret_name(m.group(1)) else f"{m.group(1)}=***",
        parts.query,
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def secrets_in(url: str) -> list[str]:
    """The secret values `url` carries (its password; an http(s) user without a password, which
    is then a token; secret query values), as written and percent-decoded, longest first: what
    must never show in a message."""
    try:
        parts = urlsplit(url)
        password, user = parts.password, parts.username
    except ValueError:
        return [url]
    found = [password] if password else []
    if user and not password and parts.scheme in ("http", "https"):
        found.append(user)
    found += [m.group(3) for m in _QUERY_PART.finditer(parts.query) if _is_secret_name(m.group(1))]
    values = {value for raw in found if raw for value in (raw, unquote(raw))}
    return sorted(values, key=len, reverse=True)


def masked(text: str, url: str) -> str:
    """`text` (a message, an exception's words) with `url` as `without_password` shows it and
    any secret of `url` left over, in whatever form a library wrote it, as `***`."""
    text = text.replace(url, without_password(url))
    for secret in secrets_in(url):
        text = text.replace(secret, "***")
    return text
