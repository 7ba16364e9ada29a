"""Emulated site networks for tests: each site in a network namespace of its own, on one bridge in
a hub namespace, with firewalls (iptables in the site's namespace), cut pairs, a middlebox that
forgets idle flows, and Debian's tinyproxy as an HTTP CONNECT proxy in the hub. Everything is made
by the test and removed afterwards; nothing touches the machine's own namespace but the names.
Needs root, `ip`, `iptables`; `skip_reason()` says why a test cannot run here."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

SUBNET = "10.201.0"          # the sites' bridge: site k at SUBNET.k, the hub (and its proxy) at .254
HUB_HOST = f"{SUBNET}.254"
PROXY_PORT = 8888
CMD_TIMEOUT_S = 20


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=CMD_TIMEOUT_S)


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"no {tool} on this machine (make test installs it as root)"
    probe = f"fpprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "netns", "exec", probe, "iptables", "-L", "-n")
        finally:
            _run("ip", "netns", "del", probe, check=False)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        return f"cannot make a network namespace with iptables here: {err.strip()[:200]}"
    return None


class SiteNet:
    """n site namespaces on one bridge. Use as a context manager."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tag = f"fp{os.getpid() % 100000}"
        self.hub = f"{self.tag}h"
        self.proxy: subprocess.Popen | None = None

    def ns(self, k: int) -> str:          # site k = 1..n
        return f"{self.tag}s{k}"

    def host(self, k: int) -> str:
        return f"{SUBNET}.{k}"

    def exec(self, k: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(k)]

    def __enter__(self) -> SiteNet:
        try:
            _run("ip", "netns", "add", self.hub)
            _run("ip", "-n", self.hub, "link", "set", "lo", "up")
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "addr", "add", f"{HUB_HOST}/24", "dev", "br0")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for k in range(1, self.n + 1):
                ns = self.ns(k)
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"h{k}",
                     "netns", self.hub)
                _run("ip", "-n", ns, "addr", "add", f"{self.host(k)}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", self.hub, "link", "set", f"h{k}", "master", "br0")
                _run("ip", "-n", self.hub, "link", "set", f"h{k}", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            try:
                self.proxy.wait(5)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
        for k in range(1, self.n + 1):
            _run("ip", "netns", "del", self.ns(k), check=False)
        _run("ip", "netns", "del", self.hub, check=False)

    # -- the sites' firewalls -------------------------------------------------------------------

    def iptables(self, k: int, *rule: str) -> None:
        _run(*self.exec(k), "iptables", *rule)

    def block_inbound(self, k: int) -> None:
        """Site k's firewall drops every new inbound connection (it dials out fine)."""
        self.iptables(k, "-A", "INPUT", "-p", "tcp", "--syn", "-j", "DROP")

    def only_through_proxy(self, k: int) -> None:
        """Site k opens connections to the proxy only (others are refused by its firewall)."""
        self.iptables(k, "-A", "OUTPUT", "-p", "tcp", "--syn", "-d", HUB_HOST, "--dport", str(PROXY_PORT),
                      "-j", "ACCEPT")
        self.iptables(k, "-A", "OUTPUT", "-p", "tcp", "--syn", "-j", "REJECT", "--reject-with", "tcp-reset")

    def middlebox(self, k: int, idle_s: int) -> None:
        """Site k sits behind a stateful middlebox (a NAT's firewall): nothing comes in but packets of
        flows site k opened, and a flow idle for `idle_s` is forgotten (its packets then dropped both
        ways, silently, as conntrack with loose pickup off does)."""
        _run(*self.exec(k), "sysctl", "-q", "-w", f"net.netfilter.nf_conntrack_tcp_timeout_established={idle_s}",
             "net.netfilter.nf_conntrack_tcp_loose=0")
        self.iptables(k, "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        self.iptables(k, "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        self.iptables(k, "-A", "INPUT", "-j", "DROP")
        self.iptables(k, "-A", "OUTPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")

    def cut(self, a: int, b: int) -> None:
        """Sites a and b cannot open connections to each other, either way (both reach the rest)."""
        for me, other in ((a, b), (b, a)):
            self.iptables(me, "-A", "OUTPUT", "-p", "tcp", "--syn", "-d", self.host(other), "-j", "DROP")

    def flat(self) -> None:
        """Every firewall rule gone: a flat network."""
        for k in range(1, self.n + 1):
            self.iptables(k, "-F", "INPUT")
            self.iptables(k, "-F", "OUTPUT")

    # -- the proxy -------------------------------------------------------------------------------

    def start_proxy(self, workdir: Path) -> str:
        """Debian's tinyproxy in the hub namespace; its URL. Raises if it is not installed."""
        binary = shutil.which("tinyproxy")
        assert binary is not None, "tinyproxy is not installed"
        conf = workdir / "tinyproxy.conf"
        conf.write_text(f"Port {PROXY_PORT}\nListen {HUB_HOST}\nTimeout 600\nMaxClients 200\n"
                        f"Allow {SUBNET}.0/24\nLogLevel Info\nLogFile \"{workdir / 'tinyproxy.log'}\"\n"
                        "DisableViaHeader Yes\n")
        self.proxy = subprocess.Popen(["ip", "netns", "exec", self.hub, binary, "-d", "-c", str(conf)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=open(workdir / "tinyproxy.err", "wb"), start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = _run("ip", "netns", "exec", self.hub, "bash", "-c",
                         f"exec 3<>/dev/tcp/{HUB_HOST}/{PROXY_PORT}", check=False)
            if probe.returncode == 0:
                return f"http://{HUB_HOST}:{PROXY_PORT}"
            time.sleep(0.1)
        raise AssertionError(f"tinyproxy did not listen: {(workdir / 'tinyproxy.err').read_text()[:300]}")


MEMORY_READ_BYTES = 16 * 1024 * 1024    # a memory search reads this much at a time


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of process `pid` holds `needle` (a memory dump, searched in
    chunks that overlap by the needle's length, so nothing is missed at a chunk's edge)."""
    overlap = len(needle) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            tail = b""
            for at in range(start, end, MEMORY_READ_BYTES):
                try:
                    mem.seek(at)
                    chunk = mem.read(min(MEMORY_READ_BYTES, end - at))
                except (OSError, ValueError, OverflowError):
                    break
                if needle in tail + chunk:
                    return True
                tail = chunk[-overlap:] if overlap else b""
    return False
