"""What a re-read peers.toml changes, in words an operator reads (`fedpeer reload`, SIGHUP).

Pure: two validated Configs in, a description out; the node applies it (fedpeer/daemon/node.py
`Node.reload`). One check reads files: a changed [data] is checked against its CSV's header as
`fedpeer init` checks it (`check_data`), so a typo there is refused with the old configuration
kept, instead of failing the next job. Peers are compared by public key, because the key is who a site is: the same
name with another key is a rotation (the old key is refused from then on), the same key under
another name is a rename, another address for a key is a move.

[node] (name, listen, advertise, key file, state dir, admin, metrics) is bound to open sockets
and files, [tracking] to the tracker the daemon built at start: a change there is reported as
needing a restart and is not applied. Limits that size
budgets at start (connection counts, inbound budgets) likewise apply at the next
start; the rest of [limits] is read at use and applies at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fedpeer.config.load import Config, Limits
from fedpeer.data.header import check_section

SECTIONS = ("policy", "data", "limits", "jobs", "membership", "election")
# [limits] fields read once at start (semaphores, budgets): changing them
# needs a restart; every other limit is read where it is used and applies at once.
LIMITS_AT_START = ("message_bytes_max", "inbound_concurrent_max", "inbound_per_peer_max",
                   "inbound_bytes_max", "outbound_inflight_max", "http_connect_timeout_ms", "http_timeout_ms")


def check_data(old: Config, new: Config) -> None:
    """A [data] that differs from the running one: its CSV exists and its header holds the label,
    the ignored columns and the id_column; else a ConfigError naming the key and the fix (the node
    then keeps running the old configuration)."""
    if new.data != old.data:
        check_section(new.path, new.data)


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...] = ()       # peer names (new keys)
    removed: tuple[str, ...] = ()     # peer names (keys no longer listed)
    rotated: tuple[str, ...] = ()     # same name, another key: old key removed, new one added
    moved: tuple[str, ...] = ()       # same key, another address
    renamed: tuple[tuple[str, str], ...] = ()   # (old, new) names of one key
    sections: tuple[str, ...] = ()   # of SECTIONS, those that differ
    node: bool = False                # [node] differs: needs a restart, not applied
    tracking: bool = False            # [tracking] differs: needs a restart, not applied
    limits_at_start: tuple[str, ...] = field(default=())   # changed limits that need a restart

    @property
    def peers_changed(self) -> bool:
        return bool(self.added or self.removed or self.rotated or self.moved or self.renamed)

    def summary(self) -> dict[str, str]:
        """One entry per area: "peers": "+site-4, -site-2", "policy": "changed", ..."""
        out = {"peers": _peer_words(self) or "unchanged"}
        for name in SECTIONS:
            out[name] = "changed" if name in self.sections else "unchanged"
        if self.limits_at_start:
            out["limits"] += f" ({', '.join(self.limits_at_start)} apply at the next start)"
        if self.node:
            out["node"] = "changed: needs a restart (not applied)"
        if self.tracking:
            out["tracking"] = "changed: needs a restart (not applied)"
        return out


def compare(old: Config, new: Config) -> Changes:
    old_by_key = {p.public_key: p for p in old.peers}
    new_by_key = {p.public_key: p for p in new.peers}
    gone = [p for k, p in old_by_key.items() if k not in new_by_key]
    came = [p for k, p in new_by_key.items() if k not in old_by_key]
    rotated = sorted({p.name for p in came} & {p.name for p in gone})
    kept = [(old_by_key[k], p) for k, p in new_by_key.items() if k in old_by_key]
    return Changes(
        added=tuple(sorted(p.name for p in came if p.name not in rotated)),
        removed=tuple(sorted(p.name for p in gone if p.name not in rotated)),
        rotated=tuple(rotated),
        moved=tuple(sorted(n.name for o, n in kept if o.address != n.address)),
        renamed=tuple(sorted((o.name, n.name) for o, n in kept if o.name != n.name)),
        sections=tuple(s for s in SECTIONS if getattr(old, s) != getattr(new, s)),
        node=old.node != new.node,
        tracking=old.tracking != new.tracking,
        limits_at_start=tuple(f for f in LIMITS_AT_START if getattr(old.limits, f) != getattr(new.limits, f)),
    )


def applicable(old: Config, new: Config) -> Config:
    """`new` as a running daemon can take it: [node], [tracking] and the start-time limits stay as they are."""
    keep = {f: getattr(old.limits, f) for f in LIMITS_AT_START}
    limits: Limits = dataclasses.replace(new.limits, **keep)
    return dataclasses.replace(new, node=old.node, limits=limits, tracking=old.tracking)


def one_line(summary: dict[str, str]) -> str:
    """"peers: +site-4; policy: changed; limits: unchanged; ..." for logs and the CLI."""
    return "; ".join(f"{k}: {v}" for k, v in summary.items())


def _peer_words(c: Changes) -> str:
    words = [f"+{n}" for n in c.added] + [f"-{n}" for n in c.removed]
    words += [f"{n} new key" for n in c.rotated] + [f"{n} new address" for n in c.moved]
    words += [f"{a} renamed {b}" for a, b in c.renamed]
    return ", ".join(words)
