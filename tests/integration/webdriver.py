"""A headless Chromium driven through chromedriver's W3C WebDriver HTTP API, for browser tests.

Spoken directly with urllib (a dozen endpoints), rather than through selenium: no extra package,
and nothing that looks for or downloads a driver over the network (selenium's manager does) — the
set-up installs Debian's `chromium` and `chromium-driver`, and the tests start exactly those.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DRIVER_START_S = 30.0        # chromedriver answering /status
COMMAND_TIMEOUT_S = 60.0     # one WebDriver command (a page load on a loaded machine)
WINDOW = (1280, 1000)        # px, at start; a screenshot grows it to the page's height
PAGE_HEIGHT_MAX = 8_000      # px of a screenshot
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"   # the W3C key of an element reference
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--window-size={WINDOW[0]},{WINDOW[1]}"]


def require_browser() -> None:
    """Chromium and its driver are part of the set-up: missing under CI is a failure, not a skip."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    message = (f"{' and '.join(missing)} not found: the browser tests need Debian's chromium and chromium-driver "
               "(`apt-get install chromium chromium-driver`, which `make test`'s set-up runs as root)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


class Browser:
    """One chromedriver process and one headless Chromium session in a fresh profile."""

    def __init__(self, port: int) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="fedpeer-chromium-"))
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"
        self.session = ""
        try:
            self._wait_ready()
            caps = {"browserName": "chrome", "goog:chromeOptions": {
                "binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={self.profile}"]}}
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + DRIVER_START_S
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline or self.driver.poll() is not None:
                raise AssertionError(f"chromedriver did not start within {DRIVER_START_S:.0f} s")
            time.sleep(0.2)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=COMMAND_TIMEOUT_S) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"WebDriver {method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def _session(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """Run JavaScript in the page (`return ...` for a value)."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css: str) -> str:
        found = self._session("POST", "/element", {"using": "css selector", "value": css})
        assert isinstance(found, dict) and ELEMENT in found, f"no element {css!r}: {found}"
        return found[ELEMENT]

    def click(self, css: str) -> None:
        self._session("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css: str, text: str) -> None:
        element = self.find(css)
        self._session("POST", f"/element/{element}/clear", {})
        self._session("POST", f"/element/{element}/value", {"text": text})

    def wait(self, script: str, timeout_s: float, what: str) -> Any:
        """Poll `script` in the page until it returns something truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.run(script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s:.0f} s; the page says: "
                                     f"{self.run('return document.body.innerText')[:3000]}")
            time.sleep(0.3)

    def screenshot(self, path: Path) -> Path:
        """The whole page as a PNG: the window first grown to the page's height."""
        height = self.run("return document.documentElement.scrollHeight")
        if height > WINDOW[1]:
            self._session("POST", "/window/rect", {"width": WINDOW[0], "height": min(height + 150, PAGE_HEIGHT_MAX)})
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
        return path

    def close(self) -> None:
        try:
            if self.session:
                self._session("DELETE", "")
        except (AssertionError, OSError, urllib.error.URLError):
            pass
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait()
            try:       # a Chromium the session left behind: it is in the driver's process group
                os.killpg(self.driver.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            shutil.rmtree(self.profile, ignore_errors=True)
