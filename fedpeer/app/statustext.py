"""`fedpeer status` and `fedpeer netcheck` as text, from the daemon's status document."""

from __future__ import annotations

from typing import Any


def peer_version(v: dict | None) -> str:
    """A peer's build in one cell: "0.2.0 be4d39cf3944 p2-2 14 caps", and how it is known."""
    if not v:
        return "-"
    how = {"assumed": " (assumed: not heard)", "refused": " (refused SiteInfo)"}.get(v["known"], "")
    return f"{v['software']} {v['commit']} p{v['protocol'][0]}-{v['protocol'][1]} {v['capabilities']} caps{how}"


def format_status(doc: dict) -> str:
    node = doc["node"]
    own = node.get("version")
    lines = [(f"node {node['name']}  {node['address']}  fingerprint {node['fingerprint']}  "
              f"up {node['uptime_s']:.0f} s  incarnation {node['incarnation']}"
              + (f"  fedpeer {own['software']} ({own['commit']}, protocol {own['protocol'][0]}-"
                 f"{own['protocol'][1]}, {len(own['capabilities'])} capabilities)" if own else "")),
             (f"leader: {doc.get('leader') or 'none yet'} (term {doc.get('term', 0)}; "
              f"this node is {doc.get('role', '-')})"), ""]
    rows = [("PEER", "STATE", "ADDRESS", "LAST SEEN", "RTT", "PATH", "RUNS")]
    for p in doc["peers"]:
        seen = "never" if p["last_seen_s"] is None else f"{p['last_seen_s']:.1f} s ago"
        rtt = "-" if p["rtt_ms"] is None else f"{p['rtt_ms']:.1f} ms"
        rows.append((p["name"], p["state"], p["address"], seen, rtt, (p.get("path") or {}).get("to", "-"),
                     peer_version(p.get("version"))))
    lines += _table(rows)
    reach = doc.get("reach")
    if reach and reach.get("state") == "outbound-only":
        lines.append(f"reach: {reach['detail']}")
    alive = sum(p["state"] == "alive" for p in doc["peers"])
    lines.append(f"\n{alive} of {len(doc['peers'])} peers alive")
    lines += [f"  {p['name']} lacks: {', '.join(p['version']['missing'])}" for p in doc["peers"]
              if (p.get("version") or {}).get("missing")]
    lines += [f"  hint: {p['hint']}" for p in doc["peers"] if p.get("hint")]
    loaded = doc.get("config")
    if loaded:
        lines.append(f"config {loaded['path']} loaded at {loaded['loaded_at']}")
        error = (loaded.get("last_reload") or {}).get("error")
        if error:
            lines.append(f"last reload refused ({loaded['last_reload']['at']}): {error}")
    if doc.get("rejected"):
        lines.append("rejected frames: " + ", ".join(f"{k}={v}" for k, v in doc["rejected"].items()))
    lag = doc.get("loop_lag_ms") or {}
    if lag.get("samples"):
        lines.append(f"event-loop lag (last minute): p50 {lag['p50']} ms, p99 {lag['p99']} ms, max {lag['max']} ms")
    if doc.get("config_error"):
        lines.append(doc["config_error"])
    return "\n".join(lines)




def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _links(path: dict[str, Any]) -> str:
    words = []
    if path.get("links_it_dialed"):
        words.append(f"{path['links_it_dialed']} it dialed to us (it said: {path.get('its_reach', '?')})")
    if path.get("links_we_dialed"):
        words.append(f"{path['links_we_dialed']} we dialed to it")
    if path.get("link_error"):
        words.append(f"last link failed: {path['link_error']}")
    return "; ".join(words) or "-"


def format_netcheck(doc: dict) -> str:
    """The reach picture: can peers dial this site, its proxy, and how each peer is reached."""
    node, reach = doc["node"], doc.get("reach") or {}
    lines = [f"node {node['name']}  advertised {node['address']}",
             f"reachable: {reach.get('state', '?')} ([network] reachable = \"{reach.get('setting', '?')}\")",
             f"  {reach.get('detail', '')}",
             f"proxy: {reach.get('proxy') or 'none'}",
             f"links this site keeps open for its peers to send on: {reach.get('links_dialed_for_peers', 0)}", ""]
    rows = [("PEER", "STATE", "PATH", "RTT", "LINKS")]
    for p in doc["peers"]:
        path = p.get("path") or {}
        rtt = "-" if p["rtt_ms"] is None else f"{p['rtt_ms']:.1f} ms"
        rows.append((p["name"], p["state"], path.get("to", "-"), rtt, _links(path)))
    lines += _table(rows)
    relayed = doc.get("relayed") or {}
    if relayed:
        lines.append("\nrelayed for others: " + ", ".join(f"{k} {v}" for k, v in sorted(relayed.items())))
    return "\n".join(lines)
