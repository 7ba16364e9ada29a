"""The private set intersection (fedpeer/protocols/psi.py) from the attacker's side (issue 38,
findings 1, 6 and 8), over the in-memory network in virtual time. Three members in ring order:
the collector (site-1, the key that sorts first: a site can choose such a key), site-2, and the
victim site-3. The collector and site-2 hold 600 IDs each, the victim 499; 300 are held by all
three, and the victim's other 199 by nobody else.

What no attack may give the collector: H(x) (the ID's hash, all blinding removed: testable
against a dictionary of likely IDs) of any of the victim's IDs outside the intersection, in any
message it receives. docs/security.md, "What vertical alignment reveals", lists each claim with
the test that shows it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from unittest import mock

from fedpeer.protocols import psi
from fedpeer.protocols.psi import PsiPoints, PsiSize
from fedpeer.runtime.channel import MalformedFrom
from fedpeer.testing.members import member_keys, run_members

COMMON = [f"x{i}" for i in range(300)]
IDS = [COMMON + [f"c{i}" for i in range(300)],       # the collector
       COMMON + [f"z{i}" for i in range(300)],       # site-2
       COMMON + [f"v{i}" for i in range(199)]]       # the victim
OUTSIDE = IDS[2][300:]


async def _inline(fn, *args):  # noqa: ANN001, ANN202
    return fn(*args)


class Meddling:
    """A member's channel whose outgoing messages pass through `change(dst, msg)` first."""

    def __init__(self, inner: Any, change: Callable[[bytes, Any], Any]) -> None:
        self.inner, self.change = inner, change

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        return await self.inner.send(dst, self.change(dst, msg))


def run(ids: list[list[str]], channel: Callable[[Any, int, bytes], Any] | None = None,
        ids_max: int | None = None) -> tuple[list, Any, list[bytes]]:
    keys, _ = member_keys("psi", len(ids))
    nets: list = []

    async def member(net, i, k):  # noqa: ANN001, ANN202
        nets.append(net)
        ch = channel(net, i, k) if channel is not None else net.channel(k)
        cap = {} if ids_max is None else {"ids_max": ids_max}
        return await psi.intersect(ch, ids[i], hop_timeout_ms=2_000, offload=_inline, **cap)
    return run_members(keys, member), nets[0], keys


def received_points(net: Any, member: bytes) -> set[bytes]:
    return {m.points[i:i + psi.POINT_BYTES] for _, dst, m in net.sent
            if dst == member and isinstance(m, PsiPoints) for i in range(0, len(m.points), psi.POINT_BYTES)}


def leaked(net: Any, member: bytes) -> int:
    """How many of the victim's IDs outside the intersection reached `member` as H(x)."""
    return len(received_points(net, member) & set(psi.hash_ids("job", OUTSIDE)))


def test_an_honest_run_gives_no_member_an_id_outside_the_intersection() -> None:
    out, net, keys = run(IDS)
    assert all(isinstance(r, psi.Intersection) and r.count == 300 for r in out), out
    assert all(leaked(net, k) == 0 for k in keys)
    assert {dst for _, dst, m in net.sent if isinstance(m, PsiPoints) and "/full/" in m.tag} == {keys[0]}, \
        "only the collector sees fully blinded lists"


def _collector_announcing(pick: Callable[[dict, list[bytes]], list[bytes]]) -> Callable[..., Any]:
    """The collector's step 3 with `pick(full lists by owner, true common points)` announced as
    the common points (its count, and its verdict on rows_min, as the protocol wants them)."""
    real = psi._count

    async def count(ch, full, rows_min, sizes, wait_ms, tag):  # noqa: ANN001, ANN202
        if ch.me != ch.members[0]:
            return await real(ch, full, rows_min, sizes, wait_ms, tag)
        common = sorted(pick(full, sorted(set.intersection(*map(set, full.values())))))
        await psi._broadcast_size(ch, f"{tag}/common", len(common))
        await psi._broadcast_size(ch, f"{tag}/verdict", 1)
        await psi._gather_sizes(ch, f"{tag}/verdict", wait_ms)
        return common, len(common)
    return count


def test_a_collector_announcing_the_victims_whole_list_learns_none_of_its_other_ids() -> None:
    """Finding 1 as reported: the collector announces the last member's whole fully blinded list
    as the common points. The members that blinded the other lists last refuse it before anyone
    removes a scalar; the collector learns no H(x) of the victim's."""
    victim = member_keys("psi", 3)[0][2]
    with mock.patch.object(psi, "_count", _collector_announcing(lambda full, _: full[victim])):
        out, net, keys = run(IDS)
    assert leaked(net, keys[0]) == 0, f"the collector learnt H(x) of {leaked(net, keys[0])} IDs outside"
    assert not any(isinstance(r, psi.Intersection) for r in out[1:]), out
    named = [r for r in out[1:] if isinstance(r, MalformedFrom)]
    assert named and all(r.peer == keys[0] for r in named), out       # on its own evidence: the collector


def test_a_collector_stripping_other_points_than_the_common_ones_is_caught_by_the_next_member() -> None:
    """The collector announces the true common points, which every member checks, but removes
    its scalar from points of the victim's list outside them instead: the next member checks its
    proof against the common points and refuses, before removing its own scalar."""
    victim = member_keys("psi", 3)[0][2]
    seen: dict = {}
    real_count, real_lap = psi._count, psi._unblinding_lap

    async def count(ch, full, *args):  # noqa: ANN001, ANN202
        if ch.me == ch.members[0]:
            seen.update(full)
        return await real_count(ch, full, *args)

    async def lap(ch, common, *args):  # noqa: ANN001, ANN202
        if ch.me == ch.members[0]:
            others = sorted(set(seen[victim]) - set(common))
            common = (others + list(common))[:len(common)]
        return await real_lap(ch, common, *args)
    with mock.patch.object(psi, "_count", count), mock.patch.object(psi, "_unblinding_lap", lap):
        out, net, keys = run(IDS)
    assert leaked(net, keys[0]) == 0, f"the collector learnt H(x) of {leaked(net, keys[0])} IDs outside"
    assert isinstance(out[1], MalformedFrom) and out[1].peer == keys[0], out


def test_a_repeated_point_is_pinned_on_the_member_that_repeated_it() -> None:
    """Finding 6: site-2 repeats a point of every other member's list it passes on. Its
    successor names it on its own evidence; neither the lists' honest owners nor the honest
    collector is named."""
    def repeat(dst: bytes, msg: Any) -> Any:
        passed_on = ("/b/" in msg.tag or "/full/" in msg.tag) and "/b/1/" not in msg.tag and "/full/1/" not in msg.tag
        if isinstance(msg, PsiPoints) and passed_on and len(msg.points) >= 64:
            return dataclasses.replace(msg, points=msg.points[:32] + msg.points[:32] + msg.points[64:])
        return msg

    keys = member_keys("psi", 3)[0]
    out, _, _ = run(IDS, lambda net, i, k: Meddling(net.channel(k), repeat) if i == 1 else net.channel(k))
    named = [r.peer for r in out if isinstance(r, MalformedFrom)]
    assert named and set(named) == {keys[1]}, out
    assert not any(isinstance(r, psi.Inconsistent) for r in out), out


def test_a_member_announcing_more_ids_than_the_policy_allows_is_refused_at_step_one() -> None:
    """Finding 8: a member announces 200,000 IDs. Every other member refuses at once, naming it,
    before it hashes or blinds a single ID (no list of points is ever sent)."""
    def inflate(dst: bytes, msg: Any) -> Any:
        return dataclasses.replace(msg, count=200_000) if isinstance(msg, PsiSize) and msg.tag.endswith("/size") \
            else msg

    keys = member_keys("psi", 3)[0]
    out, net, _ = run(IDS, lambda net, i, k: Meddling(net.channel(k), inflate) if i == 2 else net.channel(k),
                      ids_max=10_000)
    assert all(isinstance(r, psi.TooManyIds) and r.member == keys[2] for r in out[:2]), out
    assert "ids_max" in str(out[0]) and "200" not in str(out[0])
    assert not any(isinstance(m, PsiPoints) for src, _, m in net.sent if src != keys[2])


def test_the_strip_proof_holds_for_the_true_points_only() -> None:
    h = psi.hash_ids("job", ["a", "b", "c"])
    k = psi.new_scalar(bytes(range(64)))
    common = psi.blind(h, k, False)
    proof = psi.prove_strip(k, common, h, bytes(64 * [9]))
    assert psi.verify_strip(common, h, proof)
    assert not psi.verify_strip(common, [h[1], h[0], h[2]], proof)
    assert not psi.verify_strip(common, psi.hash_ids("job", ["a", "b", "d"]), proof)
    forged = psi.blind(psi.hash_ids("job", ["a", "b", "d"]), k, False)        # a proof for other points
    assert not psi.verify_strip(common, h, psi.prove_strip(k, forged, h, bytes(64 * [9])))


def test_a_vertical_job_names_the_site_over_this_sites_ids_max() -> None:
    """The [policy] ids_max reaches the job (VerticalBlock.aligned_ids_max): a site holding more
    IDs than the others allow is named by them, with the setting to change; no count is given."""
    import numpy as np

    from fedpeer.data.vertical import VerticalBlock
    from fedpeer.jobs.kind import JobContext
    from fedpeer.kinds import vertical_stats as vs

    rows = [300, 300, 2_000]
    blocks = []
    for m, n in enumerate(rows):
        X = np.random.default_rng(m).normal(size=(n, 1))
        X.setflags(write=False)
        blocks.append(VerticalBlock((f"c{m}",), X, np.array([f"id-{i}" for i in range(n)]), "ID",
                                    aligned_ids_max=1_000))
    keys, names = member_keys("vertical", 3)
    out = run_members(keys, lambda net, i, k: vs.run_vertical(net.channel(k), {"bins": 4, "secure_sum": "pairwise",
                                                                                "secure_sum_compact": True},
                                                              JobContext(names[k], names, 2_000, data=blocks[i]),
                                                              _inline))
    for r in out[:2]:
        assert str(r).startswith("site-3 announces more IDs than this site's [policy] ids_max"), out
        assert "2000" not in str(r) and "1000" not in str(r)
