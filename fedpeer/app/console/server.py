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
- Every request needs the token, page, assets and API alike, or gets 403: once as `?token=` on
  the page's URL (the answer sets it as an HttpOnly, SameSite=Strict cookie named after the port,
  and redirects to the URL without it), then the cookie. Compared in constant time.
- A `Host` other than the console's own address is refused (DNS rebinding).
- A POST also needs the page's CSRF token (a second random value, written into the page, which
  another site's page cannot read) in the CSRF_HEADER header, Content-Type application/json, and,
  when the browser says where it comes from (`Origin`, `Sec-Fetch-Site`), this very origin.
- Connections are bounded as the daemon's local listeners are (fedpeer/net/bounded.py); a request
  body is at most REQUEST_BYTES_MAX; every answer forbids framing, sniffing and caching.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import secrets
import signal
import socket
import sys
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
TOKEN_BYTES = 32                    # 256 random bits, for the URL's token and the page's CSRF token
COOKIE_PREFIX = "fedpeer_console_"  # + the port: cookies do not tell loopback ports apart
CSRF_HEADER = "X-Fedpeer-CSRF"
POLL_INTERVAL_MS = 1_000            # how often the page asks for status, jobs and the selected job
REQUEST_BYTES_MAX = 64 * 1024       # a proposal is a few hundred bytes
LISTEN_BACKLOG = 64
PORT_MAX = 65_535
STATUS_TIMEOUT_MS = 3_000           # a daemon that does not answer within this shows as unreachable
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
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        self.csrf = secrets.token_urlsafe(TOKEN_BYTES)
        self.port = port
        self.host = self.origin = self.cookie = ""
        self._page = ""
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{self.origin}/?token={self.token}"

    async def start(self) -> str:
        """Listen on loopback; the URL with the token. OSError if the port cannot be had."""
        app = web.Application(middlewares=[self._guard], client_max_size=REQUEST_BYTES_MAX)
        app.router.add_get("/", self.page)
        app.router.add_get("/static/{name}", self.asset)
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
        self.cookie = f"{COOKIE_PREFIX}{self.port}"
        self._page = (_static_text("index.html").replace("{{csrf}}", self.csrf)
                      .replace("{{poll_ms}}", str(POLL_INTERVAL_MS)))
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
        """403 for a request without the token, from another host name, or a write without the
        page's CSRF token or from another origin."""
        host = request.headers.get("Host", "").lower()
        if host != self.host:
            return _error(403, f"Host {host!r} is not this console's address {self.host}; refused "
                          "(DNS rebinding guard): open the URL `fedpeer console` printed")
        in_url = request.method == "GET" and request.path == "/" and _same(request.query.get("token", ""), self.token)
        if not (in_url or _same(request.cookies.get(self.cookie, ""), self.token)):
            return _error(403, "no console token: open the URL `fedpeer console` printed on its first line "
                          "(it ends in ?token=...)")
        if request.method in ("GET", "HEAD"):
            return None
        if not _same(request.headers.get(CSRF_HEADER, ""), self.csrf):
            return _error(403, f"{request.method} needs the page's {CSRF_HEADER} header (CSRF guard)")
        origin = request.headers.get("Origin")
        if origin is not None and origin != self.origin:
            return _error(403, f"Origin {origin!r} is not this console's {self.origin}; refused (CSRF guard)")
        if request.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return _error(403, "a request from another site is refused (CSRF guard)")
        if request.content_type != "application/json":
            return _error(403, f"{request.method} needs Content-Type: application/json")
        return None

    # -- the page -------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        if "token" in request.query:   # the token goes into the cookie, out of the address bar
            response = web.Response(status=303, headers={"Location": "/"})
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
            return response
        return web.Response(text=self._page, content_type="text/html", charset="utf-8")

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
        return _json(await self.sites[0].ask("GET", "/v1/jobs"))

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
    try:
        print(url, flush=True)        # the first line: what a script or a test reads
        print(f"fedpeer console: serving {console.sites[0].config.node.name}'s daemon on {console.origin} "
              "until stopped (Ctrl-C); open the URL above", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await console.stop()
