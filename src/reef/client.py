"""The Python way to talk to Reef's own API: `ReefClient`, and `AsyncReefClient` for asyncio.

    from reef.client import ReefClient

    with ReefClient("http://127.0.0.1:8900") as reef:
        print(reef.status()["engine"]["name"])
        reef.report([receipt], score=1, feedback="good answer")

Both send the token they are given, or else the first of the comma-separated tokens in
`REEF_TOKEN`, and answer the parsed JSON of the `/reef/...` routes (docs/http-api.md; the OpenAI
routes under `/v1` are the `openai` SDK's). A failed call raises `ReefClientError`: with the HTTP
status and the server's message when the server refused, with no status and a sentence naming
the URL (never its password) when nothing answered.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Self

import httpx

from reef.config import DEFAULT_PORT
from reef.urls import without_password

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
DEFAULT_TIMEOUT_S = 60.0
# How much of an error body that is not Reef's error envelope a message quotes (a proxy's page).
QUOTED_BODY_CHARS = 500


def env_token(variable: str = "REEF_TOKEN") -> str:
    """The first of the comma-separated tokens in the environment variable `variable`, or ''
    when it is unset. The server accepts each of them; a client sends the first."""
    return os.environ.get(variable, "").split(",")[0].strip()


class ReefClientError(Exception):
    """A call to Reef that failed; `str(error)` is a sentence to show as it is.

    When the server refused, `status` is the HTTP status and `message` the server's message
    (from its envelope, `{"error": {"message": ...}}`), and `retry_after` its Retry-After header
    if it sent one (a flooded server's 503). When nothing answered, `status` is None, `message`
    says what went wrong on the way, and `unreachable` is true if no connection was made at all.
    """

    def __init__(
        self,
        text: str,
        *,
        url: str,
        message: str,
        status: int | None = None,
        unreachable: bool = False,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(text)
        self.url = url
        self.message = message
        self.status = status
        self.unreachable = unreachable
        self.retry_after = retry_after


class _Client:
    """What both clients share: the server's URL, the token, the headers and the errors."""

    def __init__(
        self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.url = url.rstrip("/")
        self.token = env_token() if token is None else token  # '' sends none
        self.timeout_s = timeout_s

    @property
    def shown_url(self) -> str:
        """The URL as errors name it: without a password or token it may carry."""
        return without_password(self.url)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _answer(self, response: httpx.Response) -> Any:
        if response.is_success:
            return response.json()
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:QUOTED_BODY_CHARS]
        raise ReefClientError(
            f"HTTP {response.status_code}: {message}",
            url=self.shown_url,
            message=message,
            status=response.status_code,
            retry_after=response.headers.get("retry-after"),
        )

    def _no_answer(self, error: httpx.HTTPError, path: str) -> ReefClientError:
        unreachable = isinstance(error, httpx.ConnectError)
        if unreachable:
            text = f"no Reef server answers at {self.shown_url}: start one with `reef serve`"
        else:  # connected, but no whole answer: a time-out, a dropped connection
            text = f"request to {self.shown_url}{path} failed: {error}"
        return ReefClientError(
            text, url=self.shown_url, message=str(error), unreachable=unreachable
        )


class ReefClient(_Client):
    """Reef's API, one call at a time; close it (or use it in a `with` block) when done."""

    def __init__(
        self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(url, token, timeout_s)
        self._http = httpx.Client(base_url=self.url, headers=self.headers(), timeout=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The parsed JSON the server answers `method path` with; `ReefClientError` if it
        refuses or nothing answers."""
        try:
            response = self._http.request(method, path, params=params, json=json, headers=headers)
        except httpx.HTTPError as error:
            raise self._no_answer(error, path) from error
        return self._answer(response)

    def get(self, path: str, *, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, json: Any = None, *, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json=json, headers=headers)

    def status(self) -> dict[str, Any]:
        """`GET /reef/status`: the engine, uptime, releases, store and learning."""
        found: dict[str, Any] = self.get("/reef/status")
        return found

    def records(
        self,
        scenario: str | None = None,
        *,
        limit: int | None = None,
        after: str | None = None,
        order: str | None = None,
        tags: list[str] | None = None,
        search: str | None = None,
    ) -> dict[str, Any]:
        """`GET /reef/records`: one page, `{"data": [...], "has_more": bool}` (oldest first, or
        newest first with `order="desc"`; the next page starts `after` the last id), only the
        records with every one of `tags` (`name:value`) when given, and with every word of
        `search` in what was asked or answered."""
        asked = {
            "scenario": scenario,
            "limit": limit,
            "after": after,
            "order": order,
            "search": search,
        }
        params: dict[str, Any] = {k: v for k, v in asked.items() if v not in (None, "")}
        if tags:
            params["tag"] = list(tags)
        page: dict[str, Any] = self.get("/reef/records", params=params)
        return page

    def report(
        self,
        references: list[str],
        score: float | None = None,
        feedback: str | dict[str, Any] | None = None,
        *,
        scenario: str = "default",
        report_id: str | None = None,
        clamp: bool = False,
    ) -> dict[str, Any]:
        """`POST /reef/report`: a score, a feedback or both against receipts of `scenario`;
        answers the stored report. A score outside the scenario's range is refused (400), or
        with `clamp` stored at the nearer edge."""
        body: dict[str, Any] = {"references": references}
        for key, value in (("score", score), ("feedback", feedback), ("report_id", report_id)):
            if value is not None:
                body[key] = value
        if clamp:
            body["clamp"] = True
        stored: dict[str, Any] = self.post(
            "/reef/report", body, headers={"x-reef-scenario": scenario}
        )
        return stored

    def train(self, instruction: str, scenario: str = "default") -> dict[str, Any]:
        """`POST /reef/train`: queue an instruction for the learning worker (409 in auto mode
        or without a recipe); answers its id."""
        queued: dict[str, Any] = self.post(
            "/reef/train", {"scenario": scenario, "instruction": instruction}
        )
        return queued

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncReefClient(_Client):
    """Reef's API for asyncio: the same requests and errors as `ReefClient`, awaited."""

    def __init__(
        self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(url, token, timeout_s)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self.headers(), timeout=timeout_s)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The parsed JSON the server answers `method path` with; `ReefClientError` if it
        refuses or nothing answers."""
        try:
            response = await self._http.request(
                method, path, params=params, json=json, headers=headers
            )
        except httpx.HTTPError as error:
            raise self._no_answer(error, path) from error
        return self._answer(response)

    async def get(self, path: str, *, params: dict[str, Any] | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def post(
        self, path: str, json: Any = None, *, headers: dict[str, str] | None = None
    ) -> Any:
        return await self.request("POST", path, json=json, headers=headers)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
