"""A web page in the user's browser must not use a server on loopback: requests shaped as a browser
sends them (Origin, Sec-Fetch-Site, text/plain bodies, a rebound Host) against the real server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from reef.config import ServerConfig
from reef.server.browser import HostName, HostPolicy
from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SMALL_ENGINE, TOKEN, write_config

TRUSTED = "http://trusted.example:3000"
EVIL = "http://evil.example"
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server without tokens (every route open), that allows one web origin and one host."""
    folder = tmp_path_factory.mktemp("browser")
    browser = f"server:\n  allowed_origins: ['{TRUSTED}']\n  allowed_hosts: ['reef.test']\n"
    write_config(folder, SMALL_ENGINE + browser)
    with reef_serve(folder, free_port()).start() as running:
        yield running


@pytest.fixture
def receipt(server: ServerProcess) -> str:
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=HI, max_tokens=1)  # type: ignore[arg-type]
    return raw.headers["x-reef-agent-record-id"]


def reports_of(server: ServerProcess, receipt: str) -> list[dict[str, object]]:
    reports: list[dict[str, object]] = httpx.get(f"{server.url}/reef/records/{receipt}").json()[
        "reports"
    ]
    return reports


def report(server: ServerProcess, receipt: str, **headers: str) -> httpx.Response:
    body = json.dumps({"references": [receipt], "score": 1, "feedback": "from a page"})
    return httpx.post(f"{server.url}/reef/report", content=body, headers=headers)


def error_of(response: httpx.Response) -> dict[str, str]:
    error: dict[str, str] = response.json()["error"]
    assert error["type"] and error["code"] and error["message"]
    return error


# -- cross-site requests ------------------------------------------------------------------------


def test_a_cross_site_text_plain_report_is_refused_and_stores_nothing(
    server: ServerProcess, receipt: str
) -> None:
    # What a hidden form or fetch(..., {mode: "no-cors"}) on another site sends.
    response = report(server, receipt, origin=EVIL, **{"content-type": "text/plain"})
    assert response.status_code == 403
    assert "server.allowed_origins" in error_of(response)["message"]
    assert reports_of(server, receipt) == []


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": EVIL},
        {"origin": "null"},  # a sandboxed frame or a file:// page
        {"origin": "http://127.0.0.1:1"},  # the same site, another origin (port)
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site"},
    ],
)
def test_cross_site_json_is_refused_too(
    server: ServerProcess, receipt: str, headers: dict[str, str]
) -> None:
    response = report(server, receipt, **{"content-type": "application/json", **headers})
    assert response.status_code == 403, response.text
    assert error_of(response)["code"] == "cross_site_request"
    assert reports_of(server, receipt) == []


@pytest.mark.parametrize(
    "path",
    [
        "/reef/train",
        "/reef/scenarios/default/rollback",
        "/reef/scenarios/default/candidates/cand_x/approve",
        "/v1/chat/completions",
    ],
)
def test_no_route_takes_a_cross_site_request(server: ServerProcess, path: str) -> None:
    response = httpx.post(server.url + path, content="{}", headers={"origin": EVIL})
    assert response.status_code == 403


def test_a_cross_site_read_is_refused(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/reef/records", headers={"origin": EVIL})
    assert response.status_code == 403


def test_the_servers_own_pages_and_clients_without_origin_pass(
    server: ServerProcess, receipt: str
) -> None:
    own = report(server, receipt, origin=server.url, **{"content-type": "application/json"})
    assert own.status_code == 201, own.text
    plain = report(
        server, receipt, **{"content-type": "application/json; charset=utf-8"}
    )  # curl, an SDK
    assert plain.status_code == 201, plain.text
    typed = httpx.get(f"{server.url}/reef/status", headers={"sec-fetch-site": "none"})
    assert typed.status_code == 200  # typed into the address bar
    assert len(reports_of(server, receipt)) == 2


def test_an_allowed_origin_may_call_and_read_the_receipt(
    server: ServerProcess, receipt: str
) -> None:
    preflight = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={
            "origin": TRUSTED,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization, x-reef-scenario",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == TRUSTED
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": HI, "max_tokens": 1},
        headers={"origin": TRUSTED, "sec-fetch-site": "cross-site"},
        timeout=120,  # the model answers: on a loaded 2-core machine that can take over 5 s
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == TRUSTED
    assert "x-reef-agent-record-id" in response.headers["access-control-expose-headers"]
    assert (
        report(server, receipt, origin=TRUSTED, **{"content-type": "application/json"}).status_code
        == 201
    )


def test_a_preflight_from_another_origin_is_refused(server: ServerProcess) -> None:
    response = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={"origin": EVIL, "access-control-request-method": "POST"},
    )
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers


# -- bodies must be declared JSON -----------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_a_body_not_declared_json_is_415(
    server: ServerProcess, receipt: str, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = report(server, receipt, **headers)
    assert response.status_code == 415
    assert "Content-Type: application/json" in error_of(response)["message"]
    assert reports_of(server, receipt) == []


def test_a_post_without_a_body_needs_no_content_type(server: ServerProcess) -> None:
    response = httpx.post(f"{server.url}/reef/scenarios/default/candidates/cand_x/approve")
    assert response.status_code == 404  # past the checks: the candidate does not exist


# -- Host (DNS rebinding) -------------------------------------------------------------------------


def test_a_foreign_host_is_refused(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/reef/records", headers={"host": "attacker.example"})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "host_not_allowed" and "server.allowed_hosts" in error["message"]
    # The rebound page's own origin is the foreign host, so it would pass as same-origin.
    rebound = report(
        server,
        "rec_x",
        host=f"attacker.example:{server.port}",
        origin=f"http://attacker.example:{server.port}",
        **{"content-type": "application/json"},
    )
    assert rebound.status_code == 400


@pytest.mark.parametrize(
    "host", ["localhost", "127.0.0.1", "[::1]", "reef.test", "REEF.test", "localhost:1"]
)
def test_loopback_names_and_allowed_hosts_are_served(server: ServerProcess, host: str) -> None:
    response = httpx.get(f"{server.url}/reef/records", headers={"host": host})
    assert response.status_code == 200, response.text


def test_healthz_answers_whatever_the_host(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/healthz", headers={"host": "10.0.0.7:8900"})
    assert response.status_code == 200


def test_the_openai_client_still_works(server: ServerProcess) -> None:
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=HI, max_tokens=2, stream=True)  # type: ignore[arg-type]
    assert list(stream)[-1].model_extra["reef"]["agent_record_id"]  # type: ignore[index]
    assert [m.id for m in client.models.list()]


def test_a_server_with_tokens_refuses_pages_as_well(llama_server: ServerProcess) -> None:
    headers = {"authorization": f"Bearer {TOKEN}", "origin": EVIL}
    assert httpx.get(f"{llama_server.url}/reef/records", headers=headers).status_code == 403
    rebound = {"authorization": f"Bearer {TOKEN}", "host": "attacker.example"}
    assert httpx.get(f"{llama_server.url}/reef/records", headers=rebound).status_code == 400


# -- which Host values a configuration accepts ----------------------------------------------------


def accepts(sent: str, **server: object) -> bool:
    policy = HostPolicy.from_config(ServerConfig.model_validate(server))
    parsed = HostName.parse(sent)
    return parsed is not None and policy.accepts(parsed)


def test_host_policy() -> None:
    # Loopback names, any port.
    assert accepts("localhost:8900") and accepts("127.0.0.1") and accepts("[::1]:80")
    assert not accepts("attacker.example") and not accepts("localhost.attacker.example")
    # The configured host, and the allowed ones: a name with or without a port, or a subdomain.
    assert accepts("reef.lan:8900", host="reef.lan")
    assert accepts("[fd00::5]:8900", host="fd00::5")
    assert accepts("box:8900", allowed_hosts=["box:8900"]) and not accepts(
        "box:9", allowed_hosts=["box:8900"]
    )
    assert accepts("a.corp.example", allowed_hosts=["*.corp.example"])
    assert not accepts("corp.example.evil", allowed_hosts=["*.corp.example"])
    assert accepts("anything", allowed_hosts=["*"])
    # Bound to every address (which needs tokens): any Host, unless allowed_hosts narrows it.
    assert accepts("203.0.113.9:8900", host="0.0.0.0") and accepts("x.example", host="::")
    assert not accepts("x.example", host="0.0.0.0", allowed_hosts=["reef.example"])
    assert accepts("reef.example", host="0.0.0.0", allowed_hosts=["reef.example"])
    # Not a host at all.
    assert not accepts("evil$(id)", allowed_hosts=["*"]) and not accepts("a@127.0.0.1")
