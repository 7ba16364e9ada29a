"""`fedpeer console` as a user meets it: started as a process next to a federation of real daemons,
its URL read from its first line, its page opened in a real headless Chromium (Debian's, through
chromedriver: tests/integration/webdriver.py). The page trades the URL's one-time token for a
session of its own, a job proposed with its form runs, its learning curve draws; without a session
every API request is refused, a used token is refused, a fresh URL is printed when asked, and
another service on another loopback port learns nothing the browser holds for the console. A
screenshot of the page is kept (pytest's tmp_path, and $FEDPEER_TEST_ARTIFACTS when set)."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
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

    def fresh_url(self) -> str:
        """Ask the running console for a fresh URL (SIGUSR1): its next line on stdout."""
        self.process.send_signal(signal.SIGUSR1)
        url = self.process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", url), url
        return url

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


def _session(console: Console, token: str) -> tuple[int, dict]:
    """Trade a URL's token for a session, as the page does."""
    status, headers, body = console.request(
        "POST", "/api/session", {"Content-Type": "application/json", "Origin": console.origin},
        json.dumps({"token": token}).encode())
    assert "Set-Cookie" not in headers, headers
    return status, json.loads(body)


def test_without_a_session_every_api_request_is_refused_and_a_token_is_good_once(tmp_path: Path) -> None:
    """No daemon needed: the guard answers before anything is asked of one."""
    config = init_site(tmp_path / "a", "a", f"127.0.0.1:{free_ports(1)[0]}")[0]
    console = Console(config)
    try:
        for path in ("/", "/static/console.js"):      # the page and its assets hold no secret
            status, headers, body = console.request("GET", path)
            assert status == 200 and console.token.encode() not in body, path
            assert "Set-Cookie" not in headers
            assert headers["X-Frame-Options"] == "DENY" and "default-src 'none'" in headers["Content-Security-Policy"]
        for path in ("/api/status", "/api/jobs", "/api/kinds", "/api/jobs/x"):
            status, _, body = console.request("GET", path)
            assert status == 403 and "no console session" in json.loads(body)["error"], path
        assert _session(console, "wrong")[0] == 403
        status, doc = _session(console, console.token)
        assert status == 200, doc
        session = {"X-Fedpeer-Session": doc["session"]}
        assert doc["session"] != console.token
        assert _session(console, console.token)[0] == 403, "the token is good once"
        host = {"Host": f"127.0.0.1:{console.port}"}
        assert console.request("GET", "/api/kinds", session)[0] == 200
        assert console.request("GET", "/api/kinds", {**session, "Host": "evil.example"})[0] == 403
        assert console.request("GET", "/api/kinds", {"X-Fedpeer-Session": "x" * 43})[0] == 403
        fresh = console.fresh_url()
        assert fresh != console.url
        fresh_token = fresh.partition("/?token=")[2]
        status, other = _session(console, fresh_token)
        assert status == 200 and other["session"] != doc["session"]
        assert console.request("GET", "/api/kinds", session)[0] == 200, "an earlier page keeps its session"
        proposal = json.dumps({"kind": "stats", "params": {}}).encode()
        json_type = {"Content-Type": "application/json"}
        both = {**json_type, **session}
        refused = [  # (headers, what is wrong)
            (json_type, "no session"),
            ({**json_type, "X-Fedpeer-Session": "x" * 43}, "a wrong session"),
            ({**both, "Origin": "http://evil.example"}, "another origin"),
            ({**both, "Sec-Fetch-Site": "cross-site"}, "another site"),
            ({**both, "Content-Type": "text/plain"}, "a simple request"),
            ({**json_type, "Cookie": f"fedpeer_console_{console.port}={fresh_token}"}, "the token as a cookie"),
        ]
        for headers, what in refused:
            status, _, body = console.request("POST", "/api/jobs", {**host, **headers}, proposal)
            assert status == 403, (what, body)
        # With a session and its own origin it passes the guard: the daemon is asked (none runs here)
        ok = {**both, "Origin": console.origin}
        status, _, body = console.request("POST", "/api/jobs", ok, proposal)
        assert status == 503 and "no fedpeer daemon" in json.loads(body)["error"], body
        status, _, body = console.request("POST", "/api/jobs", ok, json.dumps({"kind": "stats", "params": {
            "bins": "0"}}).encode())
        assert status == 400 and "bins" in json.loads(body)["error"], body     # checked as `fedpeer run` checks it
    finally:
        assert console.stop() == 0


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Another local service on another loopback port: records every request's headers."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        type(self).seen.append(dict(self.headers))
        body = b"<!doctype html><title>another local service</title><p>hello</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_another_loopback_service_learns_nothing_the_browser_holds_for_the_console(
        tmp_path: Path, browser: Browser) -> None:
    """The console opened in the browser, the same browser then visits another service on
    127.0.0.1 (another port): nothing it is sent lets it use the console, and the URL the user
    opened (in the browser's history, a shell's scrollback) is spent."""
    config = init_site(tmp_path / "a", "a", f"127.0.0.1:{free_ports(1)[0]}")[0]
    console = Console(config)
    _Recorder.seen = []
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    serving = threading.Thread(target=other.serve_forever, daemon=True)
    serving.start()
    try:
        url = console.url
        browser.get(url)
        browser.wait(f"return location.href === {json.dumps(console.origin + '/')}", 30,
                     "the token leaves the address bar")
        browser.get(f"http://127.0.0.1:{other.server_address[1]}/")
        assert "hello" in browser.run("return document.body.innerText")
        assert _Recorder.seen, "the other service was asked"
        sent = json.dumps(_Recorder.seen)
        token = url.partition("/?token=")[2]
        assert token not in sent, f"the console's token reached another port: {sent}"
        cookies = [h.get("Cookie", "") for h in _Recorder.seen]
        for cookie in cookies:      # what the other service could replay: nothing that opens the API
            status, _, _ = console.request("GET", "/api/jobs", {"Cookie": cookie} if cookie else {})
            assert status == 403
        assert _session(console, token)[0] == 403, "the URL the user opened is spent"
    finally:
        other.shutdown()
        other.server_close()
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
        browser.get(console.origin + "/")              # without the token: nothing but how to get one
        browser.wait("return document.body.innerText.includes('no console token')", 30, "the page says why")
        browser.get(console.url)
        browser.wait(f"return location.href === {json.dumps(console.origin + '/')}", 30,
                     "the token leaves the address bar")
        browser.wait("return [...document.querySelectorAll('#peers tbody tr')].some("
                     "r => r.dataset.peer === 'site-2' && r.innerText.includes('alive'))", 30, "the peer shows alive")
        browser.wait("return document.querySelectorAll('#kind option').length > 1", 30, "the kinds load")
        browser.click("#kind option[value=gmm]")
        browser.wait("return !!document.getElementById('param-k')", 10, "the kind's parameters show")
        browser.type("#param-k", "3")
        browser.type("#param-tol", "0")                  # every EM round runs: a curve that grows for seconds
        browser.type("#param-max_iter", "1000")
        browser.click("#propose-button")
        job_id = browser.wait("const m = document.getElementById('propose-message').innerText;"
                              "return m.startsWith('proposed ') && m.slice(9)", 30, "the proposal is accepted")
        # the curve while the job runs, as the page redraws it: the points it had at each look
        seen = browser.wait(
            "const s = document.getElementById('job-section');"
            "const c = document.querySelector('#curves svg.curve[data-series=log_likelihood] polyline');"
            "window.seen = window.seen || [];"
            "if (s.dataset.state === 'running' && c) window.seen.push(c.points.numberOfItems);"
            "return s.dataset.state === 'done' && c && c.points.numberOfItems >= 2 && window.seen",
            JOB_WAIT_S, f"job {job_id} done with a curve of two points or more")
        assert len(set(seen)) >= 2 and seen == sorted(seen), f"the running job's curve grows: {seen}"
        axes = browser.run("return [...document.querySelectorAll('#curves svg.curve[data-series=log_likelihood]"
                           " .axis-title')].map(t => t.textContent)")
        assert axes == ["round", "log-likelihood (nats, all rows)"], axes
        assert browser.run("return location.hash") == f"#job={job_id}", "the job has a URL of its own"
        assert browser.run("return document.querySelectorAll('#curves .download-csv, #curves .download-svg')"
                           ".length") == 2
        text = browser.run("return document.getElementById('job-section').innerText")
        assert job_id in text and "log_likelihood" in text
        for shown in ("max_iter=1000", "data fingerprint", "site-1", "site-2"):
            assert shown in text, shown
        assert browser.run("return document.querySelectorAll('#sites tbody tr').length") == 2
        assert browser.run("return document.querySelectorAll('#sites tbody .state-done').length") == 2, \
            "both sites' results are read (--site)"
        assert browser.run("return document.cookie") == "", "nothing of the console is a cookie"
        browser.run("location.reload()")              # a reload keeps the tab's session, and the job's URL its job
        browser.wait("return [...document.querySelectorAll('#peers tbody tr')].some("
                     "r => r.dataset.peer === 'site-2')", 30, "the peers show again after a reload")
        browser.wait(f"return document.getElementById('job-id').innerText.startsWith({json.dumps(job_id)})", 30,
                     "the reloaded URL shows its job")
        record = await h.job(1, job_id)
        assert record is not None and record["state"] == "done" and record["params"]["k"] == 3
        await _compare_two_jobs(h, browser, job_id)
        shot = browser.screenshot(tmp_path / "console.png")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        artifacts = os.environ.get("FEDPEER_TEST_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shot = Path(shutil.copy(shot, Path(artifacts) / "console.png"))
        print(f"console screenshot: {shot}")
    finally:
        assert console.stop() == 0


async def _compare_two_jobs(h, browser: Browser, first: str) -> None:
    """A second job of the same kind (run through the admin API, on the same federation), picked in
    the compare menu: each series both jobs have is one chart with both curves, the axis titled as
    before and a legend naming each job; the pair has a URL of its own; the chart's CSV holds both
    jobs' columns and its SVG both curves."""
    from fedpeer.daemon import admin
    doc = await admin.request(h.sites[0].config, "POST", "/v1/jobs",
                              {"kind": "gmm", "params": {"k": 2, "tol": 0.0, "max_iter": 12}}, timeout_ms=5_000)
    second = doc["id"]
    records = await h.wait_job(second, timeout_s=JOB_WAIT_S)
    assert {(r or {}).get("state") for r in records.values()} == {"done"}, records
    browser.wait(f"return !!document.querySelector('#compare option[value={json.dumps(second)}]')", 30,
                 "the second job is offered to compare")
    browser.click(f"#compare option[value={json.dumps(second)}]")
    chart = f"#curves svg.curve[data-series=log_likelihood][data-compare={json.dumps(second)}]"
    drawn = browser.wait(f"const c = document.querySelector({json.dumps(chart)});"
                         "return c && [c.querySelector('polyline.own').points.numberOfItems,"
                         " c.querySelector('polyline.compare').points.numberOfItems]", 30, "both curves on one chart")
    assert drawn[0] >= 2 and drawn[1] == 12, drawn
    assert browser.run("return location.hash") == f"#job={first}&compare={second}", "the pair has a URL"
    texts = browser.run(f"return [...document.querySelectorAll({json.dumps(chart + ' text')})].map(t => t.textContent)")
    assert "log-likelihood (nats, all rows)" in texts and "round" in texts, texts
    assert first in texts and second in texts, f"the legend names both jobs: {texts}"
    browser.run("window.downloads = []; window.download = (name, type, text) => window.downloads.push([name, text]);"
                f"const box = document.querySelector({json.dumps(chart)}).parentElement;"
                "box.querySelector('.download-csv').click(); box.querySelector('.download-svg').click();")
    (csv_name, csv), (svg_name, svg) = browser.run("return window.downloads")
    lines = csv.splitlines()
    assert csv_name == f"{first}-vs-{second}-log_likelihood.csv"
    assert lines[0] == f"round,{first} log_likelihood,{second} log_likelihood"
    assert len(lines) == 1 + max(drawn) and all(len(line.split(",")) == 3 for line in lines)
    assert lines[1].split(",")[0] == "1" and all(line.split(",")[2] for line in lines[1:13])
    assert svg_name.endswith(".svg") and svg.count("<polyline") == 2 and second in svg
    browser.run("location.reload()")             # the pair's URL brings the pair back
    browser.wait(f"return !!document.querySelector({json.dumps(chart + ' polyline.compare')})", 30,
                 "the reloaded URL shows both jobs")
    assert browser.run("return document.getElementById('compare').value") == second
