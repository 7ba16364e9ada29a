"""The parameters many job kinds share, declared once: the secure-sum mode, the seed and the share
of a site's rows kept out for testing. A kind takes them as they are, or with its own wording of
what its seed drives and its own default test share (`dataclasses.replace` of the declaration)."""

from __future__ import annotations

import dataclasses

from fedpeer.config.bounds import BOUNDS_TEXT_MAX
from fedpeer.jobs.capabilities import DP_CART, DP_SKELLAM, DP_TREES, EPOCH_VIEWS, JOB_REJOIN, SECSUM_COMPACT
from fedpeer.jobs.kind import Param
from fedpeer.protocols import dp

SECURE_SUM_MODES = ("ring", "pairwise", "allreduce")
SEED_MAX = 2**31 - 1

# Each mode is a protocol a member must run: its capability (fedpeer/jobs/capabilities.py). A mode
# whose messages change takes a new name (and capability): the same value never names two protocols.
SECURE_SUM_CAPABILITIES = {mode: f"secsum-{mode}" for mode in SECURE_SUM_MODES}

SECURE_SUM = Param(str, "pairwise", "secure-sum mode", choices=SECURE_SUM_MODES,
                   value_capabilities=tuple(SECURE_SUM_CAPABILITIES.items()))
# sumcheck also runs the sparse ring (pairwise masks with O(log n) neighbours: masks.py), on its public vectors: a
# federation measures what sparse masking saves at its size before a kind whose sums are sites' own values
# offers it (its guarantee is probabilistic in the coalition's size: docs/security.md, "sparse").
SECURE_SUM_SPARSE = "sparse"
SECURE_SUM_WITH_SPARSE = dataclasses.replace(
    SECURE_SUM, choices=(*SECURE_SUM_MODES, SECURE_SUM_SPARSE),
    value_capabilities=(*SECURE_SUM_CAPABILITIES.items(), (SECURE_SUM_SPARSE, f"secsum-{SECURE_SUM_SPARSE}")))
# Every kind whose sums run without an initiator takes "allreduce": large vectors the all-reduce,
# each member moving ~2(n-1)/n of the vector (allreduce.py), small ones all to all in two legs
# (alltoall.py). Over the emulated WAN (bench_wan, 5 sites) a logreg iteration took 0.053 s against
# the pairwise ring's 0.251, a stats job's sum and a k-means round 2-4.5x less (BENCHMARKS.md); who
# learns what is pairwise mode's. What the ring adds is its initiator's re-run without a lost
# member: the leaderless kinds (histogram XGBoost, logreg, mlp) go on by themselves (epochs.py);
# for stats and the clustering kinds it could only save a loss inside their first sum (a later one
# fails the job in either mode), so they take the all-reduce too. bofrf's sums are re-run by their
# initiator over the survivors at any point of the job: it keeps the pairwise ring.
SECURE_SUM_LARGE = dataclasses.replace(SECURE_SUM, default="allreduce")
# The same, with who could learn what in each mode, for the kinds whose sums are a site's own values
SECURE_SUM_EXPLAINED = dataclasses.replace(
    SECURE_SUM_LARGE, help="secure-sum mode: 'allreduce' (no initiator; only all other sites together could "
                           "learn a site's sums), 'pairwise' (the same, through a ring and its initiator) or "
                           "'ring' (neighbours together could)")

# The leaderless kinds' survivors of a lost member agree on who is lost by showing each other their
# views (fedpeer/protocols/epochs.py, "Views"): new messages and tags, so every member needs the
# capability unless the job turns them off (before it, each survivor went on its own failure
# detector's word and survivors could end in different epochs, waiting on each other).
EPOCH_VIEWS_PARAM = Param(bool, True, "after a member is lost, the survivors agree on who is lost by sharing "
                          "their views (false: each by its own failure detector, as before; a job with a "
                          "member of a release without views runs with false)", capability=EPOCH_VIEWS,
                          before=False, optional=True)

# A member restarted mid-job asks to come back, and the others take it back at the next boundary
# (fedpeer/protocols/epochs.py, "Rejoins"): new messages, and views that may name a member more
# than once, so every member needs the capability; a job with a member without it runs without
# rejoins (that member, like every other, then stays out once lost). Needs epoch_views.
REJOIN_PARAM = Param(bool, True, "a member restarted mid-job comes back into it at the next boundary the kind "
                     "allows (needs epoch_views; false: a member lost stays out, as before; a job with a member "
                     "of a release without rejoins runs with false)", capability=JOB_REJOIN, before=False,
                     optional=True)

# Secure sums' compact messages (fedpeer/protocols/securesum/api.py, "Compact messages"): a re-run
# announces who is dropped instead of the whole participant list (149 MB from the initiator at 1,000
# simulated sites with 100 dropping, 1.6 MB compact), and a reveal or check carries one digest instead
# of one per member. New messages and shapes, so every member needs the capability; a job with a
# member without it runs the old messages (optional: nobody is left out for it).
SECURE_SUM_COMPACT = Param(bool, True, "secure sums send compact messages: a re-run names only who is dropped, a "
                           "reveal one digest (false: whole lists, as before; a job with a member of a release "
                           "without them runs with false)", capability=SECSUM_COMPACT, before=False, optional=True)


def seed(drives: str) -> Param:
    """The job's seed; `drives` says what it seeds (the --help text)."""
    return Param(int, 0, drives, low=0, high=SEED_MAX)


def test_fraction(default: float, low: float, help: str) -> Param:
    """The share of each site's rows kept out of training to test the model on."""
    return Param(float, default, help, low=low, high=0.9)


DP_PARAMS = {   # differential privacy, shared by the kinds that take it (stats, kmeans)
    "dp_epsilon": Param(float, 0.0, "differential privacy: the job's ε for each site's rows (0: off)",
                        low=0.0, high=dp.EPSILON_MAX, capability=DP_SKELLAM),
    "dp_delta": Param(float, 0.0, "differential privacy: the job's δ (0: 1/dp_rows_max²)",
                      low=0.0, high=dp.DELTA_MAX, capability=DP_SKELLAM),
    "dp_rows_max": Param(int, 1_000_000, "differential privacy: a public bound on the federation's rows (for δ)",
                         low=2, high=2**40, capability=DP_SKELLAM),
    "dp_colluders": Param(int, 0, "differential privacy: members that may pool their noise shares against a site; "
                          "each member adds noise for the others (0: sites do not collude)", low=0, high=1000,
                          capability=DP_SKELLAM),
    "dp_clip": Param(float, 0.0, "differential privacy: every feature value is clipped to ±dp_clip (required)",
                     low=0.0, high=1e12, capability=DP_SKELLAM),
}

# Histogram XGBoost takes the same DP parameters under its own capability (a member whose stats and
# kmeans take DP may still run an xgboost without it: it must be refused by name), without dp_clip
# (its cut points come from public per-column bounds, dp_bounds) and with dp_bounds.
DP_TREE_PARAMS = {
    **{name: dataclasses.replace(param, capability=DP_TREES)
       for name, param in DP_PARAMS.items() if name != "dp_clip"},
    "dp_bounds": Param(str, "", "differential privacy: every feature's public bounds, JSON "
                       "{\"col\": [low, high], ...}; filled from the proposer's [data] bounds when left out; "
                       "every member refuses a job whose dp_bounds differ from its own [data] bounds",
                       high=BOUNDS_TEXT_MAX, capability=DP_TREES),
}

# The tree kind (mode exact) takes the same under a capability of its own: a member whose xgboost
# takes DP may be a build whose tree refuses it, and must be refused by name (fedpeer/kinds/tree/dp.py).
DP_CART_PARAMS = {name: dataclasses.replace(param, capability=DP_CART) for name, param in DP_TREE_PARAMS.items()}
