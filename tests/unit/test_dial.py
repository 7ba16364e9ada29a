"""Opening connections: the proxy setting and the environment, NO_PROXY, and a CONNECT through a
small proxy of the test's own (what it sent, what it answered, errors without the password)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from fedpeer.config.network import Network, parse_proxy
from fedpeer.net.dial import ProxyError, Route, dial, route_from


def test_proxy_urls_parse_with_and_without_credentials() -> None:
    p = parse_proxy("http://alice:s%40cret@proxy.example:3128")
    assert (p.host, p.port, p.user, p.password) == ("proxy.example", 3128, "alice", "s@cret")
    assert str(p) == "http://proxy.example:3128"          # never the password
    assert parse_proxy("http://proxy.example").port == 8080
    assert parse_proxy("http://[::1]:3128").host == "::1"
    for bad in ("proxy.example:3128", "socks5://p:1080", "http://p:99999", "http://p:3128/path", "http://"):
        with pytest.raises(ValueError):
            parse_proxy(bad)


def test_the_setting_wins_over_the_environment_and_none_turns_it_off() -> None:
    env = {"HTTPS_PROXY": "http://env.example:3128", "NO_PROXY": "lab.example, 10.0.0.0/8"}
    assert str(route_from(Network(), env).proxy) == "http://env.example:3128"
    assert str(route_from(Network(proxy="http://mine.example:8888"), env).proxy) == "http://mine.example:8888"
    assert route_from(Network(proxy="none"), env).proxy is None
    assert route_from(Network(), {}).proxy is None
    with pytest.raises(ValueError, match="HTTPS_PROXY"):
        route_from(Network(), {"HTTPS_PROXY": "proxy:3128"})


def test_no_proxy_names_hosts_domains_and_networks_and_loopback_is_never_proxied() -> None:
    route = route_from(Network(), {"https_proxy": "http://p.example:3128", "no_proxy": ".lab.example,10.0.0.0/8,db"})
    for direct in ("a.lab.example", "lab.example", "10.1.2.3", "db", "127.0.0.1", "localhost", "::1"):
        assert route.proxy_for(direct) is None, direct
    for proxied in ("site-b.example", "11.0.0.1", "dbx", "lab.example.org"):
        assert route.proxy_for(proxied) is not None, proxied
    assert route_from(Network(), {"https_proxy": "http://p:1", "no_proxy": "*"}).proxy_for("x.example") is None


class Proxy:
    """A CONNECT proxy on loopback: records each request head, answers `status`, then pipes."""

    def __init__(self, status: str = "200 Connection established") -> None:
        self.status, self.heads = status, []

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        self.heads.append(head)
        writer.write(f"HTTP/1.1 {self.status}\r\n\r\n".encode())
        if not self.status.startswith("200"):
            writer.close()
            return
        target = head.split()[1]
        host, port = target.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()
    return await asyncio.start_server(echo, "127.0.0.1", 0)


@pytest.fixture
def loopback_proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's peers are on loopback, which a route never proxies: here it does."""
    monkeypatch.setattr("fedpeer.net.dial.is_loopback", lambda host: False)


async def test_a_connect_through_the_proxy_reaches_the_peer_with_its_credentials(loopback_proxied: None) -> None:
    peer = await echo_server()
    target_port = peer.sockets[0].getsockname()[1]
    async with Proxy() as proxy:
        route = Route(parse_proxy(f"http://alice:pw@127.0.0.1:{proxy.port}"), ())
        sock, how = await dial(f"127.0.0.1:{target_port}", route)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, b"hello through")
        assert await loop.sock_recv(sock, 100) == b"hello through"
        sock.close()
    assert how == "proxy"
    head = proxy.heads[0]
    assert head.startswith(f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\n")
    assert f"Proxy-Authorization: Basic {base64.b64encode(b'alice:pw').decode()}" in head
    peer.close()


async def test_a_proxy_that_refuses_is_one_line_without_the_password(loopback_proxied: None) -> None:
    async with Proxy("407 Proxy Authentication Required") as proxy:
        route = Route(parse_proxy(f"http://alice:topsecret@127.0.0.1:{proxy.port}"), ())
        with pytest.raises(ProxyError) as caught:
            await dial("site-b.example:7400", route)
    text = str(caught.value)
    assert "407" in text and "site-b.example:7400" in text and "topsecret" not in text and "alice" not in text
