"""The admin endpoint from a hostile local user's and a web page's side, against a real daemon.

A TCP admin (`admin = "127.0.0.1:PORT"`) is reachable by every local user and by every web page
in a local browser: it must want the token, refuse a foreign Host (DNS rebinding) and refuse what
only browsers send, and still serve the CLI. Every answer is JSON, errors included.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from fedpeer.app.harness.federation import Harness, free_ports
from fedpeer.app.sitefiles import init_site
from fedpeer.config import load as cfg
from fedpeer.daemon.admin import AdminServer, request
from fedpeer.errors import FedpeerError

pytestmark = pytest.mark.integration


def fedpeer(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpeer", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def ask(port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict]:
    """One raw HTTP request, headers exactly as given (http.client adds no Host when one is given)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{port}", **headers})
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.getheader("Content-Type", "").startswith("application/json"), (resp.status, raw)
        return resp.status, json.loads(raw)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def tcp_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Harness, int]]:
    (port,) = free_ports(1)
    h = Harness(tmp_path_factory.mktemp("admin"), 1, {"node": {"admin": f"127.0.0.1:{port}"}})
    h.create()
    h.start()
    try:
        asyncio.run(h.wait_until(lambda s: s[0] is not None, 20, "the daemon answers on its TCP admin"))
        yield h, port
    finally:
        h.stop()


def _token(h: Harness) -> str:
    return (h.sites[0].config.node.state_dir / "admin.token").read_text().strip()


def test_token_file_is_private_and_required(tcp_site: tuple[Harness, int]) -> None:
    h, port = tcp_site
    token_file = h.sites[0].config.node.state_dir / "admin.token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    status, doc = ask(port, "GET", "/v1/status", {})
    assert status == 401 and "admin token" in doc["error"] and str(token_file) in doc["error"]
    wrong = "x" * len(_token(h))
    assert ask(port, "GET", "/v1/status", {"Authorization": f"Bearer {wrong}"})[0] == 401
    assert ask(port, "GET", "/v1/status", {"Authorization": _token(h)})[0] == 401, "scheme is Bearer"
    status, doc = ask(port, "GET", "/v1/status", {"Authorization": f"Bearer {_token(h)}"})
    assert status == 200 and doc["node"]["name"] == "site-1"


def test_foreign_host_origin_and_simple_requests_are_refused(tcp_site: tuple[Harness, int]) -> None:
    h, port = tcp_site
    auth = {"Authorization": f"Bearer {_token(h)}"}
    status, doc = ask(port, "GET", "/v1/status", {**auth, "Host": f"rebind.example:{port}"})
    assert status == 403 and "Host" in doc["error"], doc
    status, doc = ask(port, "GET", "/v1/status", {**auth, "Origin": "http://evil.example"})
    assert status == 403 and "Origin" in doc["error"], doc
    proposal = json.dumps({"kind": "stats", "params": {}}).encode()
    for headers in ({"Content-Type": "text/plain"},            # a web page's "simple request"
                    {**auth, "Content-Type": "text/plain"},
                    {**auth, "Content-Type": "application/x-www-form-urlencoded"},
                    {**auth}):                                    # no Content-Type at all
        status, doc = ask(port, "POST", "/v1/jobs", headers, proposal)
        assert status == 403 and "application/json" in doc["error"], (headers, doc)
    status, doc = ask(port, "GET", "/v1/jobs", auth)
    assert status == 200 and doc["jobs"] == [], "no refused proposal may have created a job"


def test_every_error_is_json(tcp_site: tuple[Harness, int]) -> None:
    h, port = tcp_site
    auth = {"Authorization": f"Bearer {_token(h)}"}
    status, doc = ask(port, "GET", "/v1/nothing-here", auth)
    assert status == 404 and "/v1/nothing-here" in doc["error"]
    status, doc = ask(port, "DELETE", "/v1/status", {**auth, "Content-Type": "application/json"})
    assert status == 405 and "error" in doc
    status, doc = ask(port, "POST", "/v1/jobs", {**auth, "Content-Type": "application/json"}, b"{not json")
    assert status == 400 and "bad request" in doc["error"]


def test_cli_reads_the_token(tcp_site: tuple[Harness, int]) -> None:
    h, _ = tcp_site
    config = str(h.sites[0].config_path)
    r = fedpeer("status", "--config", config)
    assert r.returncode == 0 and "node site-1" in r.stdout, r.stderr
    token_file = h.sites[0].config.node.state_dir / "admin.token"
    hidden = token_file.with_name("hidden.token")
    token_file.rename(hidden)
    try:
        r = fedpeer("status", "--config", config)
    finally:
        hidden.rename(token_file)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "admin token" in r.stderr and str(token_file) in r.stderr, "the refusal names the file to read"
    r = fedpeer("job", "cancel", "no-such-job", "--config", config)   # a POST: JSON body, JSON refusal
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no-such-job" in r.stderr and "ContentType" not in r.stderr


def test_cli_answers_a_non_json_server_in_one_line(tmp_path: Path) -> None:
    """Whatever answers on the admin address (a 500 page, another program), the CLI says one line."""
    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 (http.server's naming)
            body = b"500 Internal Server Error\n\nServer got itself in trouble"
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        path, _ = init_site(tmp_path, "x", f"127.0.0.1:{free_ports(1)[0]}",
                            admin=f"127.0.0.1:{server.server_address[1]}")
        r = fedpeer("status", "--config", str(path))
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "HTTP 500" in lines[0] and "not JSON" in lines[0], r.stderr
    assert "ContentTypeError" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_admin_path_that_is_not_a_socket_is_never_deleted(tmp_path: Path, kind: str) -> None:
    precious = tmp_path / "important.csv"
    precious.write_text("id,value\n1,42\n")
    path, _ = init_site(tmp_path, "x", f"127.0.0.1:{free_ports(1)[0]}",
                        admin="unix:important.csv" if kind == "file" else "unix:link.sock")
    if kind == "symlink":
        (tmp_path / "link.sock").symlink_to(precious)
    r = fedpeer("start", "--config", str(path), timeout=20)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "exists and is not a socket; refusing to delete it" in lines[0], r.stderr
    assert precious.read_text() == "id,value\n1,42\n"
    assert kind == "file" or (tmp_path / "link.sock").is_symlink()


def test_a_stale_socket_is_replaced_and_stop_unlinks_only_its_own(tmp_path: Path) -> None:
    """In-process: a socket left by a dead daemon goes; a file put where ours was stays."""
    path, _ = init_site(tmp_path, "x", f"127.0.0.1:{free_ports(1)[0]}", admin="unix:admin.sock")
    config = cfg.load(path)
    sock_path = tmp_path / "admin.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:   # bound, never listening
        dead.bind(str(sock_path))

    async def status(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def scenario() -> None:
        server = AdminServer(config, {("GET", "/v1/status"): status})
        await server.start()
        try:
            assert stat.S_IMODE(os.lstat(sock_path).st_mode) == 0o600
            assert await request(config, "GET", "/v1/status") == {"ok": True}
            sock_path.unlink()
            sock_path.write_text("the operator's file\n")   # put there while the daemon ran
        finally:
            await server.stop()
    asyncio.run(scenario())
    assert sock_path.read_text() == "the operator's file\n"


def test_a_failing_handler_answers_json_500_and_the_server_goes_on(tmp_path: Path) -> None:
    """In-process: a full disk inside one request is that request's 500, in JSON, not the daemon's end."""
    path, _ = init_site(tmp_path, "x", f"127.0.0.1:{free_ports(1)[0]}", admin="unix:admin.sock")
    config = cfg.load(path)

    async def full_disk(_: web.Request) -> web.Response:
        raise OSError(28, "No space left on device")

    async def status(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def scenario() -> None:
        server = AdminServer(config, {("POST", "/v1/jobs"): full_disk, ("GET", "/v1/status"): status})
        await server.start()
        try:
            with pytest.raises(FedpeerError) as err:
                await request(config, "POST", "/v1/jobs", {"kind": "stats"})
            assert "No space left on device" in str(err.value) and "\n" not in str(err.value)
            assert await request(config, "GET", "/v1/status") == {"ok": True}
        finally:
            await server.stop()
    asyncio.run(scenario())


def test_a_request_racing_a_start_retries_once_with_the_new_token(tmp_path: Path, monkeypatch) -> None:
    """A daemon binds, then writes its new token, then serves: a CLI that read the file in between
    (a token a kill -9'd daemon left, or none) is answered 401 and must retry with the new one."""
    (port,) = free_ports(1)
    path, _ = init_site(tmp_path, "x", f"127.0.0.1:{free_ports(1)[0]}", admin=f"127.0.0.1:{port}")
    config = cfg.load(path)
    import fedpeer.daemon.adminclient as admin_module   # the client side of the admin API
    real_read, reads = admin_module.read_token, []

    def read_token_at_the_wrong_moment(c: cfg.Config) -> str | None:
        reads.append(1)
        return "token-of-the-daemon-before" if len(reads) == 1 else real_read(c)
    monkeypatch.setattr(admin_module, "read_token", read_token_at_the_wrong_moment)

    async def status(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def scenario() -> None:
        server = AdminServer(config, {("GET", "/v1/status"): status})
        await server.start()
        try:
            assert await request(config, "GET", "/v1/status") == {"ok": True}
        finally:
            await server.stop()
        assert not (config.node.state_dir / "admin.token").exists(), "stop removes its token"
    asyncio.run(scenario())


def test_three_thousand_idle_connections_leave_status_answering_with_descriptors_bounded(
        tcp_site: tuple[Harness, int]) -> None:
    """A local user opens 3,000 connections to the TCP admin port and sends nothing: the daemon
    keeps at most LOCAL_CONNECTIONS_MAX of them (each closed after FIRST_BYTES_MS of silence, the
    oldest silent one shed for a newcomer), its open descriptors stay bounded, and a status request
    made meanwhile is answered within 2 s (fedpeer/net/bounded.py)."""
    import resource
    import time

    from fedpeer.net.bounded import LOCAL_CONNECTIONS_MAX

    h, port = tcp_site
    pid = h.sites[0].process.pid
    before = len(os.listdir(f"/proc/{pid}/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4_000)), hard))
    held: list[socket.socket] = []
    try:
        for _ in range(3_000):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except (BlockingIOError, ConnectionError, OSError):
                pass
            held.append(s)
        time.sleep(0.5)
        most = max(len(os.listdir(f"/proc/{pid}/fd")) for _ in range(5))
        started = time.monotonic()
        status, doc = ask(port, "GET", "/v1/status", {"Authorization": f"Bearer {_token(h)}"})
        took = time.monotonic() - started
        assert status == 200 and doc["node"]["name"] == "site-1", doc
        assert took < 2.0, f"status took {took:.2f} s among 3,000 idle connections"
        assert most <= before + LOCAL_CONNECTIONS_MAX + 8, (before, most)
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    r = fedpeer("status", "--config", str(h.sites[0].config_path))
    assert r.returncode == 0 and "node site-1" in r.stdout, r.stderr


def test_open_files_limit_in_status_is_read_live(tcp_site: tuple[Harness, int]) -> None:
    """An operator lowers the running daemon's limit (prlimit): status says the new one at once."""
    import resource

    h, _ = tcp_site
    pid = h.sites[0].process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft - 7, hard))
        doc = asyncio.run(h.status(0))
        assert doc["connections"]["open_files_limit"] == soft - 7, doc["connections"]
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
