"""Browser safety: what keeps a web page the user opens from using a server on loopback.

A server without tokens listens on loopback, and any page in the user's browser can reach
loopback. Three checks, before authentication and routing, close that door:

- `Host` must be a name the server is reached by (loopback names, `server.host`,
  `server.allowed_hosts`): a page on a domain the attacker rebinds to 127.0.0.1 sends its own
  domain as Host (DNS rebinding). 400.
- A cross-site request (its `Origin`, or `Sec-Fetch-Site: cross-site` / `same-site`, says another
  origin sent it) is refused unless that origin is in `server.allowed_origins`. 403. Requests
  without those headers (curl, the SDKs) are not from a page, and pass.
- A body must be declared `Content-Type: application/json`. A page can send `text/plain` or a
  form across sites without asking the server first (no CORS preflight); JSON it cannot. 415.

Starlette's TrustedHostMiddleware is not used for the Host check: its refusal is the plain text
"Invalid host header" (every Reef error is OpenAI's JSON shape, naming what to change), it cannot
leave /healthz open, and its patterns are names only (no `name:port`, no "any loopback address").

`/healthz` skips the Host check: it reads and changes nothing, and health probes of load
balancers and orchestrators address the server by whatever IP they see it at.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.config import ServerConfig
from reef.errors import BadRequest, ConfigurationRefused, Forbidden, ReefError
from reef.server.auth import OPEN_PATHS, is_loopback

JSON_MEDIA_TYPE = "application/json"
CROSS_FETCH_SITES = frozenset({"cross-site", "same-site"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# A host name or a bracketed IPv6 address, then an optional port; nothing else belongs in Host.
_HOST = re.compile(r"(?P<name>[a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
# Response headers a page allowed by server.allowed_origins may read: the receipt and release.
EXPOSED_HEADERS = ["x-reef-agent-record-id", "x-reef-release-id", "x-reef-arm"]


class HostNotAllowed(BadRequest):
    code = "host_not_allowed"


class CrossSiteRequest(Forbidden):
    code = "cross_site_request"


class UnsupportedMediaType(ReefError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


@dataclass(frozen=True)
class HostName:
    """The name and port of a `Host` value or an allowed-hosts entry, lowercased, unbracketed."""

    name: str
    port: int | None

    @classmethod
    def parse(cls, value: str) -> HostName | None:
        match = _HOST.fullmatch(value.strip().lower())
        if match is None:
            return None
        port = match.group("port")
        return cls(match.group("name").strip("[]").rstrip("."), int(port) if port else None)


@dataclass(frozen=True)
class HostPolicy:
    """Which `Host` values the server answers to. `any_host`: bound to a wildcard address."""

    patterns: tuple[str, ...]
    any_host: bool = False

    @classmethod
    def from_config(cls, server: ServerConfig) -> HostPolicy:
        patterns = [entry.strip().lower() for entry in server.allowed_hosts]
        bound_to_all = _is_wildcard(server.host)
        if not bound_to_all:
            patterns.append(_bracketed(server.host.strip().lower()))
        return cls(tuple(patterns), any_host=bound_to_all and not server.allowed_hosts)

    def accepts(self, host: HostName) -> bool:
        if self.any_host or is_loopback(host.name):
            return True
        return any(_host_matches(host, pattern) for pattern in self.patterns)


def _is_wildcard(bind_host: str) -> bool:
    try:
        return ipaddress.ip_address(bind_host.strip("[]")).is_unspecified
    except ValueError:
        return bind_host in ("", "*")


def _bracketed(host: str) -> str:
    """An IPv6 bind address as it appears in a Host header."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _host_matches(host: HostName, pattern: str) -> bool:
    """`*` matches any host; `*.example.com` its subdomains; a pattern with a port that port."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.name.endswith(pattern[1:])
    wanted = HostName.parse(pattern)
    if wanted is None or wanted.name != host.name:
        return False
    return wanted.port is None or wanted.port == host.port


@dataclass(frozen=True)
class Origin:
    """scheme, host and port of an origin, with the scheme's default port made explicit."""

    scheme: str
    host: str
    port: int | None

    @classmethod
    def parse(cls, value: str) -> Origin | None:
        scheme, separator, rest = value.strip().lower().rstrip("/").partition("://")
        host = HostName.parse(rest) if separator else None
        if scheme not in DEFAULT_PORTS or host is None:
            return None  # "null" (sandboxed pages, file://), or not an origin at all
        return cls(scheme, host.name, host.port or DEFAULT_PORTS[scheme])

    @classmethod
    def of_request(cls, scheme: str, host: HostName) -> Origin:
        return cls(scheme, host.name, host.port or DEFAULT_PORTS.get(scheme))

    def serialized(self) -> str:
        """As a browser sends it in `Origin`: no default port, IPv6 in brackets."""
        port = "" if self.port == DEFAULT_PORTS.get(self.scheme) else f":{self.port}"
        return f"{self.scheme}://{_bracketed(self.host)}{port}"


@dataclass(frozen=True)
class OriginPolicy:
    allowed: frozenset[Origin]

    @classmethod
    def from_config(cls, server: ServerConfig) -> OriginPolicy:
        return cls(frozenset(_allowed_origin(entry) for entry in server.allowed_origins))

    def refusal(self, headers: Headers, own: Origin | None) -> CrossSiteRequest | None:
        """Why a request some other site's page sent is refused; None when it may pass."""
        sent = headers.get("origin")
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        origin = Origin.parse(sent) if sent is not None else None
        if origin is not None and origin == own:
            return None
        if sent is None and fetch_site not in CROSS_FETCH_SITES:
            return None  # not sent by a page of another origin: curl, an SDK, the address bar
        if origin in self.allowed:
            return None
        sender = f"origin {sent!r}" if sent is not None else f"a {fetch_site} page (Sec-Fetch-Site)"
        return CrossSiteRequest(
            f"refused a cross-site request from {sender}: a web page may call Reef only from an "
            "origin listed in server.allowed_origins"
        )


def _allowed_origin(entry: str) -> Origin:
    origin = Origin.parse(entry)
    if origin is None:
        raise ConfigurationRefused(
            f"server.allowed_origins: {entry!r} is not an origin; write scheme://host[:port], "
            "as in http://localhost:3000"
        )
    return origin


def content_type_refusal(headers: Headers) -> UnsupportedMediaType | None:
    """Why a request's body is refused for its declared type; None for JSON or no body."""
    length = headers.get("content-length", "").strip()
    has_body = "transfer-encoding" in headers or length not in ("", "0")
    declared = headers.get("content-type")
    if not has_body or _media_type(declared or "") == JSON_MEDIA_TYPE:
        return None
    got = f"got {declared!r}" if declared is not None else "the header is missing"
    return UnsupportedMediaType(
        f"send the request body as JSON with the header `Content-Type: {JSON_MEDIA_TYPE}` "
        f"({got}; curl -d needs -H 'content-type: {JSON_MEDIA_TYPE}')"
    )


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class BrowserGuard:
    """ASGI middleware: the Host, cross-site and content-type checks, refusals in OpenAI's shape."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, origins: OriginPolicy) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                response = JSONResponse(error.to_json(), status_code=error.status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> ReefError | None:
        headers = Headers(scope=scope)
        sent_host = headers.get("host")
        host = HostName.parse(sent_host) if sent_host is not None else None
        if sent_host is not None and scope["path"] not in OPEN_PATHS:
            refused = self._host_refusal(sent_host, host)
            if refused is not None:
                return refused
        own = Origin.of_request(scope["scheme"], host) if host is not None else None
        return self.origins.refusal(headers, own) or content_type_refusal(headers)

    def _host_refusal(self, sent: str, host: HostName | None) -> HostNotAllowed | None:
        if host is not None and self.hosts.accepts(host):
            return None
        return HostNotAllowed(
            f"this server does not answer to the host {sent!r}: add it to server.allowed_hosts "
            "if clients reach the server by that name"
        )


def browser_middleware(server: ServerConfig) -> list[Middleware]:
    """The guard, and CORS answers for the pages of `server.allowed_origins` when there are any."""
    origins = OriginPolicy.from_config(server)
    guard = Middleware(BrowserGuard, hosts=HostPolicy.from_config(server), origins=origins)
    if not origins.allowed:
        return [guard]
    cors = Middleware(
        CORSMiddleware,
        allow_origins=sorted(origin.serialized() for origin in origins.allowed),
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=EXPOSED_HEADERS,
    )
    return [guard, cors]
