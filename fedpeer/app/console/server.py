"""`fedpeer console`: a web page on loopback that shows the federation (peers, state, RTT, bytes,
leader and term), the jobs with live progress, a job's curves, its model card and per-site
results, and proposes jobs. The page is fedpeer/app/console/static/ (shipped in the package: no
CDN, nothing fetched from elsewhere); fedpeer/app/console/views.py shapes what it shows.

A process of its own: it asks the daemon over the admin endpoint with the command line's client
(fedpeer/daemon/adminclient.py), and the daemon keeps refusing browsers; the page asks only this process. A job
proposed on the page takes the path of `fedpeer run`: its parameters checked against the kind's
declaration here, then the daemon's `[policy]`.

Rules, because every local user and every web page in a local browser can reach a loopback port:
- It binds 127.0.0.1 only (port 0, a free one, unless `--port`). The first line on stdout is its
  URL with a fresh random token (TOKEN_BYTES), as Jupyter prints its own.
- The token is good once: the page reads it from its address (and takes it out of the address bar
  at once) and trades it (POST /api/session) for a session of its own, a second random value the
  page holds in its tab (sessionStorage: this origin's, port included) and sends in SESSION_HEADER
  with every request. The token is then replaced by a fresh one, which the console prints as a new
  URL when asked (Enter on its terminal, or SIGUSR1). Nothing is ever a cookie: browsers send a
  loopback cookie to every port of the host, so another local service's page could read it.
- The page and its assets hold nothing secret and are served to anyone; every API request needs a
  live session (SESSIONS_MAX of them, the oldest dropped), compared by its SHA-256.
- A `Host` other than the console's own address is refused (DNS rebinding).
- A POST also needs Content-Type application/json and, when the browser says where it comes from
  (`Origin`, `Sec-Fetch-Site`), this very origin. (Another site's page cannot send the session
  header without a CORS preflight the console never grants, and cannot read the session.)
- Connections are bounded as the daemon's local listeners are (fedpeer/net/bounded.py); a request
  body is at most REQUEST_BYTES_MAX; every answer forbids framing, sniffing and caching.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import sys
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from fedpeer.app.console import views
from fedpeer.config import load as cfg
from fedpeer.daemon import adminclient as admin
from fedpeer.errors import FedpeerError, JobError, NoDaemonError
from fedpeer.net.bounded import close, local_runner, serve

HOST = "127.0.0.1"
TOKEN_BYTES = 32                    # 256 random bits, for the URL's token and a page's session
SESSION_HEADER = "X-Fedpeer-Session"
SESSIONS_MAX = 8                    # pages holding a session at once (the oldest dropped: its page asks again)
POLL_INTERVAL_MS = 1_000            # how often the page asks for status, jobs and the selected job
REQUEST_BYTES_MAX = 64 * 1024       # a proposal is a few hundred bytes
LISTEN_BACKLOG = 64
PORT_MAX = 65_535
STDIN_READ_BYTES = 4096             # one read of what is typed on the console's terminal
STATUS_TIMEOUT_MS = 3_000           # a daemon that does not answer within this shows as unreachable
ASK_FRESH = "ask the console for a fresh URL: press Enter where `fedpeer console` runs, or send it SIGUSR1"
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class SiteLink:
    """A site whose daemon the console asks: this site (first), or another on this machine."""

    config: cfg.Config
    fingerprint: str | None = None     # learnt from its status

    async def ask(self, method: str, path: str, payload: Any = None,
                  timeout_ms: int = admin.ADMIN_TIMEOUT_MS) -> Any:
        return await admin.request(self.config, method, path, payload, timeout_ms=timeout_ms)

    async def status(self) -> dict:
        doc = await self.ask("GET", "/v1/status", timeout_ms=STATUS_TIMEOUT_MS)
        self.fingerprint = doc["node"]["fingerprint"]
        return doc


class Console:
    def __init__(self, configs: list[cfg.Config], port: int = 0) -> None:
        self.sites = [SiteLink(c) for c in configs]
        self.token = secrets.token_urlsafe(TOKEN_BYTES)     # good for one session, then replaced
        self._sessions: OrderedDict[bytes, None] = OrderedDict()   # SHA-256 of each live session, oldest first
        self.port = port
        self.host = self.origin = ""
        self._page = ""
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{self.origin}/?token={self.token}"

    def fresh_url(self) -> str:
        """A URL with a new token (the one printed before, if unused, is good no more)."""
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        return self.url

    async def start(self) -> str:
        """Listen on loopback; the URL with the token. OSError if the port cannot be had."""
        app = web.Application(middlewares=[self._guard], client_max_size=REQUEST_BYTES_MAX)
        app.router.add_get("/", self.page)
        app.router.add_get("/static/{name}", self.asset)
        app.router.add_post("/api/session", self.open_session)
        app.router.add_get("/api/status", self.status)
        app.router.add_get("/api/kinds", self.kinds)
        app.router.add_get("/api/jobs", self.jobs)
        app.router.add_post("/api/jobs", self.propose)
        app.router.add_get("/api/jobs/{id}", self.job)
        app.router.add_post("/api/jobs/{id}/cancel", self.cancel)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, self.port))
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.host, self.origin = f"{HOST}:{self.port}", f"http://{HOST}:{self.port}"
        self._page = _static_text("index.html").replace("{{poll_ms}}", str(POLL_INTERVAL_MS))
        self._runner = local_runner(app)
        await self._runner.setup()
        self._server, _ = await serve(self._runner, sock=sock)
        return self.url

    async def stop(self) -> None:
        await close(self._server, self._runner)
        self._server = self._runner = None

    # -- the guard ------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = self._refusal(request)
        if response is None:
            try:
                response = await handler(request)
            except web.HTTPException as exc:       # the router's 404 and 405, the body cap's 413
                if exc.status < 400:
                    raise
                response = _error(exc.status, f"{request.method} {request.path}: {exc.reason}")
            except NoDaemonError as exc:
                response = _error(503, str(exc))
            except JobError as exc:
                response = _error(400, str(exc))
            except FedpeerError as exc:            # the daemon refused: its one line
                response = _error(400, str(exc))
        response.headers.update(SECURITY_HEADERS)
        return response

    def _refusal(self, request: web.Request) -> web.Response | None:
        """403 for another host name, an API request without a live session, or a write from
        another origin or not in JSON. The page and its assets are public; trading the URL's token
        for a session (POST /api/session) needs the token instead of a session."""
        host = request.headers.get("Host", "").lower()
        if host != self.host:
            return _error(403, f"Host {host!r} is not this console's address {self.host}; refused "
                          "(DNS rebinding guard): open the URL `fedpeer console` printed")
        public = request.method in ("GET", "HEAD") and not request.path.startswith("/api/")
        if public:
            return None
        if request.path != "/api/session" and not self._session_known(request.headers.get(SESSION_HEADER, "")):
            return _json({"error": f"no console session: open the URL `fedpeer console` printed (it ends in "
                                   f"?token=...); {ASK_FRESH}", "session": "unknown"}, 403)
        if request.method in ("GET", "HEAD"):
            return None
        origin = request.headers.get("Origin")
        if origin is not None and origin != self.origin:
            return _error(403, f"Origin {origin!r} is not this console's {self.origin}; refused (CSRF guard)")
        if request.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return _error(403, "a request from another site is refused (CSRF guard)")
        if request.content_type != "application/json":
            return _error(403, f"{request.method} needs Content-Type: application/json")
        return None

    def _session_known(self, given: str) -> bool:
        # looked up by its SHA-256: what a lookup's timing could tell is about a hash, not the session
        return bool(given) and _digest(given) in self._sessions

    # -- the page -------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=self._page, content_type="text/html", charset="utf-8")

    async def open_session(self, request: web.Request) -> web.Response:
        """The URL's token, once, for a session of the page's own; the token is replaced."""
        try:
            doc = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        given = doc.get("token") if isinstance(doc, dict) else None
        if not isinstance(given, str) or not _same(given, self.token):
            return _error(403, f"this URL's token was used already, or is not the console's: {ASK_FRESH}")
        self.token = secrets.token_urlsafe(TOKEN_BYTES)      # spent: the next URL needs a new one
        session = secrets.token_urlsafe(TOKEN_BYTES)
        self._sessions[_digest(session)] = None
        while len(self._sessions) > SESSIONS_MAX:
            self._sessions.popitem(last=False)
        return _json({"session": session})

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            return _error(404, f"no asset {name!r}")
        return web.Response(text=_static_text(name), content_type=STATIC[name], charset="utf-8")

    # -- the API: this site's daemon, asked as the command line asks it -------------------------

    async def status(self, request: web.Request) -> web.Response:
        return _json(await self.sites[0].status())

    async def kinds(self, request: web.Request) -> web.Response:
        return _json({"kinds": views.kinds_doc(), "poll_ms": POLL_INTERVAL_MS})

    async def jobs(self, request: web.Request) -> web.Response:
        return _json(views.job_list(await self.sites[0].ask("GET", "/v1/jobs")))

    async def propose(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        kind, params, members = views.proposal(doc)
        answer = await self.sites[0].ask("POST", "/v1/jobs", {"kind": kind, "params": params, "members": members})
        return _json({"id": answer["id"]})

    async def cancel(self, request: web.Request) -> web.Response:
        return _json(await self.sites[0].ask("POST", f"/v1/jobs/{request.match_info['id']}/cancel"))

    async def job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        try:
            record = await self.sites[0].ask("GET", f"/v1/jobs/{job_id}")
        except NoDaemonError:
            raise
        except FedpeerError as exc:
            return _error(404, str(exc))
        readings = await asyncio.gather(*(self._reading(site, job_id, record if i == 0 else None)
                                          for i, site in enumerate(self.sites)))
        return _json(views.job_view(record, readings))

    async def _reading(self, site: SiteLink, job_id: str,
                       record: dict | None) -> tuple[str | None, str, dict | None, str | None]:
        """(fingerprint, name, its record of the job or None, why none) of one site."""
        name = site.config.node.name
        try:
            if site.fingerprint is None:
                await site.status()
            if record is None:
                record = await site.ask("GET", f"/v1/jobs/{job_id}", timeout_ms=STATUS_TIMEOUT_MS)
        except NoDaemonError:
            return site.fingerprint, name, None, "its daemon does not answer"
        except FedpeerError:
            return site.fingerprint, name, None, "it holds no record of this job"
        return site.fingerprint, name, record, None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "replace")).digest()


def _same(given: str, secret: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), secret.encode("ascii"))


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(views.finite(doc)), status=status, content_type="application/json")


def _error(status: int, text: str) -> web.Response:
    return _json({"error": text}, status)


def _static_text(name: str) -> str:
    return resources.files("fedpeer.app.console").joinpath("static", name).read_text(encoding="utf-8")


# -- the command ----------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    """`fedpeer console`: serve until SIGINT or SIGTERM; 0 then, 2 if the port cannot be had."""
    if not 0 <= args.port <= PORT_MAX:
        print(f"fedpeer console: --port {args.port}: a port is 0 (any free one) to {PORT_MAX}", file=sys.stderr)
        return 2
    configs = [cfg.load(path) for path in (args.config, *(args.site or ()))]
    try:
        asyncio.run(_serve(Console(configs, args.port)))
    except OSError as exc:
        print(f"fedpeer console: cannot listen on {HOST}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(console: Console) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    url = await console.start()
    loop.add_signal_handler(signal.SIGUSR1, _print_fresh_url, console)
    typed = sys.stdin is not None and sys.stdin.isatty()
    if typed:
        loop.add_reader(sys.stdin.fileno(), _on_enter, console, loop)
    try:
        print(url, flush=True)        # the first line: what a script or a test reads
        print(f"fedpeer console: serving {console.sites[0].config.node.name}'s daemon on {console.origin} "
              "until stopped (Ctrl-C); open the URL above (good once; press Enter, or send SIGUSR1 to "
              f"pid {os.getpid()}, for a fresh one)", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        if typed:
            loop.remove_reader(sys.stdin.fileno())
        await console.stop()


def _print_fresh_url(console: Console) -> None:
    print(console.fresh_url(), flush=True)


def _on_enter(console: Console, loop: asyncio.AbstractEventLoop) -> None:
    """A line typed on the console's terminal asks for a fresh URL; at end of input, stop listening."""
    if os.read(sys.stdin.fileno(), STDIN_READ_BYTES):
        _print_fresh_url(console)
    else:
        loop.remove_reader(sys.stdin.fileno())
