"""Capabilities: what a build can run, by name, and what a job needs of each of its members.

A capability is a short name for one thing a member must understand to take part: a job kind
(`kind-<name>`, or the kind's own `capability`), a value of a parameter that selects a protocol
(secure-sum modes: `secsum-allreduce`, fedpeer/jobs/params.py), a parameter added after a release
(its `Param.capability`), a message format. A build provides every capability its job kinds declare,
plus the formats of its own daemon (BUILD_FORMATS); a site says which it provides in its SiteInfo
(fedpeer/jobs/versions.py), and a site that never says is taken as the previous release
(fedpeer/kinds/releases.py).

Rules: a job needs its kind's capability and the capability of every value it uses; a parameter
only some members know is needed only when it is not at its default, and is left out of the
proposal at its default (the member that does not know it uses the same default). A parameter added with a new default
behaviour names what members without it do (`Param.before`): its capability is needed at every other
value, the default included. An optional parameter (`Param.optional`, e.g. xgboost's
`train_loss`) never leaves a member out: when some member lacks its capability the proposer
settles it at `before` for the whole job (`settled`). A proposal that leaves out a parameter
with a capability means its `before` value (`filled`): the proposer left it out for a member
without it, or does not know it itself. A parameter 0.1.0 knows is always carried, so a default changed since
(kmeans' `standardize`) reaches an old member as the value it must use. Formats only
newer builds understand are therefore used only when every member has them: a kind chooses a
new format through a parameter whose default is the old one. Names are short, lower-case and
stable: a protocol that changes takes a new name, never the old one's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from fedpeer.jobs.kind import JobKind

CAPABILITY_BYTES_MAX = 64
CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
SITE_INFO = "msg-site-info"         # says its version and capabilities (fedpeer/jobs/versions.py)
REVERSE_LINKS = "net-reverse-links"   # takes links a peer dialed to it, turned round (fedpeer/net/reverse.py)
RELAY = "net-relay"                   # relays sealed frames between members (fedpeer/net/relay.py)
DIALBACK = "msg-dialback"             # dials a member back on request (fedpeer/daemon/reach.py)
VERTICAL_2 = "vertical-psi-2"         # vertical jobs: PSI checked by every member, gathers under commitments
DP_SKELLAM = "dp-skellam-1"           # DP jobs: members' Skellam noise shares inside the sum (fedpeer/protocols/dp.py)
DP_LOGREG = "dp-logreg-1"             # logreg with DP: clipped per-row gradients, noised (kinds/linear/logreg_dp.py)
DP_TREES = "dp-trees-1"               # xgboost with DP: noised level sums, public bounds (kinds/xgboost/hist_dp.py)
EPOCH_VIEWS = "epoch-views-1"         # survivors share views of the lost (jobs/params.py EPOCH_VIEWS_PARAM)
JOB_REJOIN = "job-rejoin-1"           # a restarted member comes back into a running job (jobs/params.py REJOIN_PARAM)
DP_CART = "dp-cart-1"                 # tree with DP: noised class counts per level, public bounds (kinds/tree/dp.py)
SECSUM_COMPACT = "secsum-compact-1"   # secure sums' compact messages (jobs/params.py SECURE_SUM_COMPACT)
BUILD_FORMATS = frozenset({SITE_INFO, REVERSE_LINKS, RELAY, DIALBACK, VERTICAL_2, DP_SKELLAM})   # beyond any kind's


def of_kind(kind: JobKind) -> str:
    """The capability a member needs to run `kind` at all."""
    return kind.capability or f"kind-{kind.name}"


def declared(kind: JobKind) -> frozenset[str]:
    """Every capability `kind` declares: its own, its parameters', its parameters' values'."""
    caps = {of_kind(kind)}
    for param in kind.params.values():
        if param.capability:
            caps.add(param.capability)
        caps.update(cap for _, cap in param.value_capabilities)
    return frozenset(caps)


def provided(kinds: Iterable[JobKind], formats: Iterable[str] = BUILD_FORMATS) -> frozenset[str]:
    """What a build with these kinds and daemon formats can run."""
    caps = set(formats)
    for kind in kinds:
        caps |= declared(kind)
    bad = sorted(c for c in caps if not CAPABILITY_RE.fullmatch(c))
    assert not bad, f"capability names must match {CAPABILITY_RE.pattern}: {bad}"
    return frozenset(caps)


def needed(kind: JobKind, params: Mapping[str, Any], vertical: bool = False) -> list[str]:
    """What a job of `kind` with checked `params` needs of every member, in a stable order: the
    kind's capability first, then by parameter; over vertical data, the vertical protocol's."""
    needs = [of_kind(kind)]
    if vertical and kind.vertical:
        needs.append(VERTICAL_2)
    for name, param in kind.params.items():
        value = params.get(name, param.default)
        if param.capability and value != param.without_capability:
            needs.append(param.capability)
        needs += [cap for v, cap in param.value_capabilities if v == value]
    return list(dict.fromkeys(needs))


def lacking(kind: JobKind, params: Mapping[str, Any], caps: frozenset[str], vertical: bool = False) -> list[str]:
    """What a member with `caps` lacks for this job (empty: it can take part)."""
    return [cap for cap in needed(kind, params, vertical) if cap not in caps]


def settled(kind: JobKind, params: Mapping[str, Any], member_caps: Iterable[frozenset[str]]) -> dict[str, Any]:
    """`params` with every optional parameter at its `before` value when some member lacks its
    capability: the job runs without what that parameter adds, with every member."""
    every = list(member_caps)
    return {name: (kind.params[name].before if name in kind.params and kind.params[name].optional
                   and any(kind.params[name].capability not in caps for caps in every) else value)
            for name, value in params.items()}


def filled(kind: JobKind, params: Mapping[str, Any]) -> dict[str, Any]:
    """A received proposal's parameters with each parameter it leaves out that has a capability
    at the value a member without that capability acts on (`for_members` leaves them out only at
    that value); the others the kind's checks fill in with their defaults."""
    return {**{name: p.without_capability for name, p in kind.params.items()
               if p.capability and name not in params}, **params}


def for_members(kind: JobKind, params: Mapping[str, Any], member_caps: Iterable[frozenset[str]]) -> dict[str, Any]:
    """The parameters a proposal carries: a parameter some member does not know is left out at its
    default (that member fills in the same default); `lacking` refuses it at any other value."""
    every = list(member_caps)
    return {name: value for name, value in params.items()
            if not (name in kind.params and kind.params[name].capability
                    and value == kind.params[name].without_capability
                    and any(kind.params[name].capability not in caps for caps in every))}
