"""The parameters many job kinds share, declared once: the secure-sum mode, the seed and the share
of a site's rows kept out for testing. A kind takes them as they are, or with its own wording of
what its seed drives and its own default test share (`dataclasses.replace` of the declaration)."""

from __future__ import annotations

import dataclasses

from fedpeer.jobs.kind import Param

SECURE_SUM_MODES = ("ring", "pairwise", "allreduce")
SEED_MAX = 2**31 - 1

SECURE_SUM = Param(str, "pairwise", "secure-sum mode", choices=SECURE_SUM_MODES)
# The kinds that go on without a lost member by themselves (fedpeer/protocols/epochs.py: histogram
# XGBoost, logreg, mlp) and the tree: no initiator and no ring. Large vectors take the all-reduce,
# each member moving ~2(n-1)/n of the vector (allreduce.py); small ones go all to all in two legs
# (alltoall.py): over the emulated WAN (bench_wan, 5 sites) a logreg iteration took 0.053 s against
# the pairwise ring's 0.251. The ring's modes stay the default where a sum re-run by its initiator
# over the survivors is how a kind goes on without a lost member (stats, clustering, bofrf): for
# stats and the clustering kinds that is a loss inside their first sum only (a later one fails the
# job in either mode), at 2-4.5x the all-to-all's time per sum over that WAN (BENCHMARKS.md).
SECURE_SUM_LARGE = dataclasses.replace(SECURE_SUM, default="allreduce")
# The same, with who could learn what in each mode, for the kinds whose sums are a site's own values
SECURE_SUM_EXPLAINED = dataclasses.replace(
    SECURE_SUM, help="secure-sum mode: 'ring' (neighbours together could learn a site's sums) "
                     "or 'pairwise' (only all other sites together could)")


def seed(drives: str) -> Param:
    """The job's seed; `drives` says what it seeds (the --help text)."""
    return Param(int, 0, drives, low=0, high=SEED_MAX)


def test_fraction(default: float, low: float, help: str) -> Param:
    """The share of each site's rows kept out of training to test the model on."""
    return Param(float, default, help, low=low, high=0.9)
