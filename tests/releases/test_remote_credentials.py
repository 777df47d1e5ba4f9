"""A release remote's credentials stay out of every command line, trace and file, with the real
git and git-lfs over HTTP: `git http-backend` (git's own smart-HTTP server) and a small Git LFS
batch API behind a server on 127.0.0.1 that requires Basic authentication. What git's child
processes were started with is seen twice: in git's and git-lfs's own trace (`GIT_TRACE`, every
`run_command`/`exec`) and by sampling `/proc/*/cmdline` while they run."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from reef.releases import remote as remote_module
from reef.releases.chain import ReleaseChain
from reef.releases.remote import RemoteUnreachable

USER, TOKEN = "reef", "s3cret-token"
HARNESS = {"AGENTS.md": b"Be brief.\n"}
WEIGHTS = {"adapter.gguf": b"GGUF" + bytes(range(256)) * 64}  # an LFS object
BLOB_GRANT = "grant-for-this-batch"  # what an LFS batch answer hands out for its transfers


class GitServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), GitHandler)
        self.root = root
        self.lfs: dict[str, bytes] = {}
        self.answered: list[int] = []  # the status of each request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class GitHandler(BaseHTTPRequestHandler):
    server: GitServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.server.answered.append(status)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        body = self._body()
        expected = "Basic " + base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()
        if "/info/lfs/blob/" in self.path:  # as an LFS server's storage: by the batch's header
            self._blob(self.path.rsplit("/", 1)[1], body)
            return
        if self.headers.get("Authorization") != expected:
            self._answer(401, b"", {"WWW-Authenticate": 'Basic realm="reef"'})
            return
        path, _, query = self.path.partition("?")
        if "/info/lfs/" in path:
            self._lfs(path, body)
            return
        environment = {
            "PATH": os.environ["PATH"],
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": USER,  # http-backend takes pushes from an authenticated user
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        result = subprocess.run(
            ["git", "http-backend"], input=body, env=environment, capture_output=True, check=True
        )
        head, _, content = result.stdout.partition(b"\r\n\r\n")
        status, headers = 200, {}
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name.lower() != "content-length":
                headers[name] = value.strip()
        self._answer(status, content, headers)

    def _lfs(self, path: str, body: bytes) -> None:
        """The Git LFS API as git-lfs speaks it: the batch call, basic transfers, lock checks."""
        kind = {"Content-Type": "application/vnd.git-lfs+json"}
        if path.endswith("/locks/verify"):
            self._answer(200, json.dumps({"ours": [], "theirs": []}).encode(), kind)
        elif path.endswith("/objects/batch"):
            batch = json.loads(body)
            objects = []
            for item in batch["objects"]:
                href = {
                    "href": f"{self.server.url}/remote.git/info/lfs/blob/{item['oid']}",
                    "header": {"X-Blob-Grant": BLOB_GRANT},
                }
                have = item["oid"] in self.server.lfs
                if batch["operation"] == "upload":
                    actions = {} if have else {"actions": {"upload": href}}
                    objects.append({**item, "authenticated": True, **actions})
                elif have:
                    objects.append({**item, "authenticated": True, "actions": {"download": href}})
                else:
                    objects.append({**item, "error": {"code": 404, "message": "not found"}})
            answer = {"transfer": "basic", "objects": objects}
            self._answer(200, json.dumps(answer).encode(), kind)
        else:
            self._answer(404, b"")

    def _blob(self, oid: str, body: bytes) -> None:
        if self.headers.get("X-Blob-Grant") != BLOB_GRANT:
            self._answer(403, b"")
        elif self.command == "PUT":
            assert hashlib.sha256(body).hexdigest() == oid
            self.server.lfs[oid] = body
            self._answer(200, b"")
        elif oid in self.server.lfs:
            self._answer(200, self.server.lfs[oid], {"Content-Type": "application/octet-stream"})
        else:
            self._answer(404, b"")

    do_GET = do_POST = do_PUT = _handle


@pytest.fixture(autouse=True)
def bounded_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few kilobytes move here: a transfer that takes minutes is a failure, not a wait."""
    monkeypatch.setattr(remote_module, "TRANSFER_TIMEOUT_S", 120.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    root = tmp_path / "served"
    subprocess.run(["git", "init", "--quiet", "--bare", str(root / "remote.git")], check=True)
    http = GitServer(root)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield http
    finally:
        http.shutdown()
        http.server_close()


@contextlib.contextmanager
def command_lines() -> Iterator[list[str]]:
    """Every process command line seen in /proc while the block runs (sampled continuously)."""
    seen: set[str] = set()
    done = threading.Event()

    def sample() -> None:
        # A pause between scans leaves the GIL to the git server's threads in this process; git's
        # helpers live for a whole request, far longer than a pause.
        while not done.wait(0.002):
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    with contextlib.suppress(OSError), open(f"{entry.path}/cmdline", "rb") as line:
                        seen.add(line.read().replace(b"\0", b" ").decode(errors="replace"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    lines: list[str] = []
    try:
        yield lines
    finally:
        done.set()
        sampler.join()
        lines.extend(sorted(seen))


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc (Linux)")
def test_the_token_of_an_https_remote_is_in_no_command_line_trace_or_file(
    tmp_path: Path, server: GitServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "git-trace.log"
    stored = tmp_path / "stored-credentials"
    user_config = tmp_path / "gitconfig"
    # The user's own git configuration: an identity, and a helper that writes down every
    # credential git is given (`store`): it must be neither asked for nor given the token.
    user_config.write_text(
        "[user]\n\tname = Reef Tests\n\temail = tests@reef.invalid\n"
        f"[credential]\n\thelper = store --file={stored}\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(user_config))
    monkeypatch.setenv("GIT_TRACE", str(trace))
    monkeypatch.setenv("GIT_TRACE_SETUP", str(trace))
    url = f"http://{USER}:{TOKEN}@127.0.0.1:{server.server_address[1]}/remote.git"
    first = ReleaseChain(tmp_path / "a" / "releases.git", url)
    second = ReleaseChain(tmp_path / "b" / "releases.git", url)

    with command_lines() as seen:
        first.publish("default", "lora", WEIGHTS, None)  # fetch, LFS push, push
        assert second.catch_up()  # ls-remote, fetch, LFS fetch
        assert second.files("default@1") == WEIGHTS  # authentication worked, LFS object too
        later = second.publish("default", "harness", HARNESS, "default@1")
        assert first.catch_up()
        assert first.head("default").release_id == later.release_id  # type: ignore[union-attr]

    assert 401 in server.answered and 200 in server.answered  # the server did ask for it
    assert server.lfs  # the weights went through git-lfs, over HTTP, with the credential
    git_lines = [line for line in seen if "git" in line]
    assert any("git-remote-http" in line for line in git_lines)  # the sampler saw git's helper
    assert all(TOKEN not in line for line in seen), [line for line in seen if TOKEN in line]
    traced = trace.read_text(errors="replace")
    assert "run_command" in traced and "git-remote-http" in traced  # the trace saw them too
    assert TOKEN not in traced
    assert not stored.exists() or TOKEN not in stored.read_text()  # never written down
    for copy in (first.path, second.path):  # nor anywhere in the local copies (config, logs)
        for file in Path(copy).rglob("*"):
            if file.is_file():
                assert TOKEN.encode() not in file.read_bytes(), file
    assert TOKEN not in json.dumps(second.remote.state.to_json())  # type: ignore[union-attr]


def test_a_wrong_token_is_refused_with_a_message_that_does_not_show_it(
    tmp_path: Path, server: GitServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    url = f"http://{USER}:wrong-{TOKEN}@127.0.0.1:{server.server_address[1]}/remote.git"
    chain = ReleaseChain(tmp_path / "a" / "releases.git", url)
    with pytest.raises(RemoteUnreachable, match="could not be reached") as refused:
        chain.catch_up()
    assert 401 in server.answered
    assert TOKEN not in refused.value.message and "***" in refused.value.message
