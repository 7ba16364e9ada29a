"""The admin API's handlers: what `fedpeer status`, `run`, `jobs`, `job show/cancel`, `ping` and
`reload` ask the local daemon (fedpeer/daemon/admin.py serves them; the node does the work)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from fedpeer.errors import ConfigError, JobError
from fedpeer.net.transport import SendError

PING_COUNT_MAX = 10_000              # probes one `fedpeer ping` may send
PING_BYTES_MAX = 256 * 1024 * 1024   # and count x payload_bytes at most (a diagnostic, not a flood)
PING_ENVELOPE_BYTES = 1024            # a probe's envelope around its payload (larger probes go as streams)


class AdminRoutes:
    def __init__(self, node: Any) -> None:
        self._node = node

    def table(self) -> dict[tuple[str, str], Any]:
        return {("GET", "/v1/status"): self.status,
                ("POST", "/v1/diag/ping"): self.ping,
                ("POST", "/v1/jobs"): self.propose,
                ("GET", "/v1/jobs"): self.jobs,
                ("GET", "/v1/jobs/{id}"): self.job,
                ("POST", "/v1/jobs/{id}/cancel"): self.cancel,
                ("POST", "/v1/reload"): self.reload}

    async def reload(self, request: web.Request) -> web.Response:
        try:
            return web.json_response({"path": str(self._node.config.path), "changes": self._node.reload()})
        except ConfigError as exc:
            return web.json_response({"error": f"configuration error: {exc}"}, status=400)

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self._node.status())

    async def propose(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            kind, params = str(doc["kind"]), dict(doc.get("params") or {})
            members = doc.get("members")
            job_id = await self._node.jobs.propose_when_known(kind, params,
                                                              [str(n) for n in members] if members else None)
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        except JobError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"id": job_id})

    async def jobs(self, request: web.Request) -> web.Response:
        return web.json_response({"jobs": self._node.jobs.list()})

    async def job(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._node.jobs.show(request.match_info["id"]))
        except JobError as exc:
            return web.json_response({"error": str(exc)}, status=404)

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._node.jobs.cancel(request.match_info["id"]))
        except JobError as exc:
            return web.json_response({"error": str(exc)}, status=400)

    async def ping(self, request: web.Request) -> web.Response:
        try:
            doc = await request.json()
            peer, count, size = str(doc["peer"]), int(doc.get("count", 10)), int(doc.get("payload_bytes", 64))
            size_max = self._node.config.limits.payload_bytes_max - PING_ENVELOPE_BYTES
            if not (1 <= count <= PING_COUNT_MAX and 0 <= size <= size_max and count * size <= PING_BYTES_MAX):
                raise ValueError(f"count or payload_bytes out of range (count <= {PING_COUNT_MAX}, "
                                 f"count x payload_bytes <= {PING_BYTES_MAX})")
            return web.json_response({"peer": peer, "payload_bytes": size,
                                      "delivery_ms": await self._node.ping(peer, count, size)})
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        except (ConfigError, SendError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
