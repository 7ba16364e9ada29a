"""Leader certificates of the election (fedpeer/core/election/raft.py): what a voter signs, and the
check that a heartbeat's certificate proves its sender won the term.

A leader proves its election (authority is checked, not assumed).
Raft trusts a heartbeat's claim of a won election; one member's key could
then announce itself leader of term + 1 and have the job layer obey it. Here
a granted RequestVoteReply carries the voter's signature over
`vote_statement(term, candidate)` (domain "fedpeer/v1 vote"); the candidate
checks each one before counting it (a bad signature is not a vote, so a
lying voter cannot make an honest leader's certificate worthless) and, once
elected, sends the quorum it collected as a certificate in its heartbeats
to every follower until that follower's HeartbeatReply says `follows`
(then heartbeats go without it, so the steady state costs nothing). A
follower takes src as leader of term T, and adopts T if higher, only after
a certificate shows a quorum of distinct members voted for (T, src): src's
own vote is implied by its authenticated heartbeat, ours is known if we cast
it, every other one needs its signature. A certificate is verified once per
(term, leader) and remembered; later heartbeats cost no signature check.
A heartbeat that proves nothing makes nobody leader and changes no term; it
is answered with our term and `follows=False`, which is also how a restarted
follower asks the leader for the certificate again. Verification stops at
the first bad signature (an honest leader never sends one), so a forged
heartbeat costs at most one failed check plus the real votes it replays.
PreVote grants are not signed: they elect nobody. Signing and checking are
injected (`sign(statement)`, `verify(voter, statement, signature)`), so the
election stays pure. What signatures cannot stop: a Byzantine VOTER signing
two candidates in one term (it is in every quorum intersection it likes);
one vote per term is enforced only on honest members."""

from __future__ import annotations

from collections.abc import Callable

from fedpeer.core.election.wire import NodeId, VoteSig

VOTE_DOMAIN = b"fedpeer/v1 vote\x00"  # a vote signature can never pass for any other statement

Sign = Callable[[bytes], bytes]                 # my signature over a statement
Verify = Callable[[NodeId, bytes, bytes], bool]  # (voter, statement, signature) -> valid?


def vote_statement(term: int, candidate: NodeId) -> bytes:
    """What a voter signs when it grants its vote of `term` to `candidate`."""
    return VOTE_DOMAIN + term.to_bytes(8, "big") + candidate


def certificate_proves(leader: NodeId, term: int, certificate: tuple[VoteSig, ...], members: frozenset[NodeId],
                       quorum: int, known: set[NodeId], verify: Verify) -> bool:
    """True if a quorum of distinct `members` voted for `leader` in `term`: the votes of `known`
    need no signature (the leader's own, implied by its authenticated heartbeat; ours, if we cast
    it), every other one needs a valid signature in `certificate`."""
    voters = [v.voter for v in certificate]
    if (len(set(voters)) != len(voters) or leader in voters
            or not members.issuperset(voters)):
        return False  # an honest leader never sends these: refuse without checking anything
    if len(known.union(voters)) < quorum:
        return False
    statement = vote_statement(term, leader)
    # all() stops at the first bad signature: a forgery costs one failed check.
    return all(verify(v.voter, statement, v.sig) for v in certificate if v.voter not in known)
