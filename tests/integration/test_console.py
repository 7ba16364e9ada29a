"""`fedpeer console` as a user meets it: started as a process next to a federation of real daemons,
its URL read from its first line, its page opened in a real headless Chromium (Debian's, through
chromedriver: tests/integration/webdriver.py). The page loads with the token, a job proposed with
its form runs, its learning curve draws; without the token every request is refused, and so is a
write without the page's CSRF token or from another origin. A screenshot of the page is kept
(pytest's tmp_path, and $FEDPEER_TEST_ARTIFACTS when set)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import free_ports
from fedpeer.app.sitefiles import init_site
from tests.integration.test_cluster import write_sites
from tests.integration.test_jobs import _attach_data
from tests.integration.webdriver import Browser, require_browser

pytestmark = pytest.mark.integration

JOB_WAIT_S = 90.0          # proposed in the browser to curve drawn, on a loaded 2-core machine


class Console:
    """A `fedpeer console` process; stopped with SIGTERM (it must exit 0)."""

    def __init__(self, config: Path, *others: Path) -> None:
        args = [sys.executable, "-m", "fedpeer", "console", "--config", str(config)]
        for other in others:
            args += ["--site", str(other)]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.url = self.process.stdout.readline().strip()    # blocks until the first line (or its exit)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", self.url), \
            (self.url, self.process.stderr.read() if self.process.poll() is not None else "")
        self.origin, _, self.token = self.url.partition("/?token=")
        self.port = int(self.origin.rsplit(":", 1)[1])

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("the console did not stop on SIGTERM") from None
        finally:
            self.process.stdout.close()
            self.process.stderr.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    require_browser()
    b = Browser(free_ports(1)[0])
    try:
        yield b
    finally:
        b.close()


def _cookie_and_csrf(console: Console) -> tuple[str, str]:
    status, headers, _ = console.request("GET", f"/?token={console.token}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    pair = cookie.split(";")[0]
    status, _, page = console.request("GET", "/", {"Cookie": pair})
    assert status == 200
    csrf = re.search(rb'name="fedpeer-csrf" content="([^"]+)"', page).group(1).decode()
    return pair, csrf


def test_without_the_token_or_the_csrf_token_every_request_is_refused(tmp_path: Path) -> None:
    """No daemon needed: the guard answers before anything is asked of one."""
    config = init_site(tmp_path / "a", "a", f"127.0.0.1:{free_ports(1)[0]}")[0]
    console = Console(config)
    try:
        for path in ("/", "/static/console.js", "/api/status", "/api/jobs", "/?token=wrong"):
            status, headers, body = console.request("GET", path)
            assert status == 403, path
            assert "token" in json.loads(body)["error"]
            assert headers["X-Frame-Options"] == "DENY" and "default-src 'none'" in headers["Content-Security-Policy"]
        cookie, csrf = _cookie_and_csrf(console)
        assert csrf != console.token
        host = {"Host": f"127.0.0.1:{console.port}"}
        assert console.request("GET", "/api/kinds", {"Cookie": cookie})[0] == 200
        assert console.request("GET", "/api/kinds", {"Cookie": cookie, "Host": "evil.example"})[0] == 403
        assert console.request("GET", "/api/kinds", {"Cookie": "fedpeer_console_1=" + console.token})[0] == 403
        proposal = json.dumps({"kind": "stats", "params": {}}).encode()
        json_type = {"Content-Type": "application/json"}
        both = {**json_type, "Cookie": cookie, "X-Fedpeer-CSRF": csrf}
        refused = [  # (headers, what is wrong)
            ({**json_type, "Cookie": cookie}, "no CSRF header"),
            ({**both, "X-Fedpeer-CSRF": "x" * len(csrf)}, "a wrong CSRF token"),
            ({**both, "Origin": "http://evil.example"}, "another origin"),
            ({**both, "Sec-Fetch-Site": "cross-site"}, "another site"),
            ({**both, "Content-Type": "text/plain"}, "a simple request"),
            ({**json_type, "X-Fedpeer-CSRF": csrf}, "no cookie"),
        ]
        for headers, what in refused:
            status, _, body = console.request("POST", "/api/jobs", {**host, **headers}, proposal)
            assert status == 403, (what, body)
        # With both tokens and its own origin it passes the guard: the daemon is asked (none runs here)
        ok = {**json_type, "Cookie": cookie, "X-Fedpeer-CSRF": csrf, "Origin": console.origin}
        status, _, body = console.request("POST", "/api/jobs", ok, proposal)
        assert status == 503 and "no fedpeer daemon" in json.loads(body)["error"], body
        status, _, body = console.request("POST", "/api/jobs", ok, json.dumps({"kind": "stats", "params": {
            "bins": "0"}}).encode())
        assert status == 400 and "bins" in json.loads(body)["error"], body     # checked as `fedpeer run` checks it
    finally:
        assert console.stop() == 0


async def test_a_job_proposed_in_the_browser_runs_and_its_curve_draws(make_federation, browser: Browser,
                                                                      tmp_path: Path) -> None:
    _, paths = write_sites(tmp_path, seed=11)
    h = make_federation(2, start=False)
    _attach_data(h, paths[:2], ignore=["Id"])        # unlabelled rows: a clustering job
    h.start()
    await h.wait_all_alive(timeout_s=30)
    console = Console(h.sites[0].config_path, h.sites[1].config_path)
    try:
        browser.get(console.origin + "/")              # without the token: refused
        assert "no console token" in browser.run("return document.body.innerText")
        browser.get(console.url)
        assert browser.run("return location.href") == console.origin + "/", "the token leaves the address bar"
        browser.wait("return [...document.querySelectorAll('#peers tbody tr')].some("
                     "r => r.dataset.peer === 'site-2' && r.innerText.includes('alive'))", 30, "the peer shows alive")
        browser.wait("return document.querySelectorAll('#kind option').length > 1", 30, "the kinds load")
        browser.click("#kind option[value=kmeans]")
        browser.wait("return !!document.getElementById('param-k')", 10, "the kind's parameters show")
        browser.type("#param-k", "3")
        browser.click("#propose-button")
        job_id = browser.wait("const m = document.getElementById('propose-message').innerText;"
                              "return m.startsWith('proposed ') && m.slice(9)", 30, "the proposal is accepted")
        points = browser.wait(
            "const s = document.getElementById('job-section');"
            "const c = document.querySelector('#curves svg.curve polyline');"
            "return s.dataset.state === 'done' && c && c.points.numberOfItems >= 2 && c.points.numberOfItems",
            JOB_WAIT_S, f"job {job_id} done with a curve of two points or more")
        assert points >= 2
        text = browser.run("return document.getElementById('job-section').innerText")
        assert job_id in text and "inertia" in text
        for shown in ("k=3", "data fingerprint", "site-1", "site-2"):
            assert shown in text, shown
        assert browser.run("return document.querySelectorAll('#sites tbody tr').length") == 2
        assert browser.run("return document.querySelectorAll('#sites tbody .state-done').length") == 2, \
            "both sites' results are read (--site)"
        assert browser.run("return document.cookie") == "", "the token cookie is HttpOnly"
        shot = browser.screenshot(tmp_path / "console.png")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        artifacts = os.environ.get("FEDPEER_TEST_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shot = Path(shutil.copy(shot, Path(artifacts) / "console.png"))
        print(f"console screenshot: {shot}")
        record = await h.job(1, job_id)
        assert record is not None and record["state"] == "done" and record["params"]["k"] == 3
    finally:
        assert console.stop() == 0
