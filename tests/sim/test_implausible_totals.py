"""One member of a simulated federation poisons its contribution to one secure sum (a fixed-point
extreme in a value's top limb, or a count made huge or wrapped below zero, at a random entry of a
random sum): every member fails the job with the check's one line, naming the sum and no site;
no member returns a model. One hypothesis test per kind: stats, kmeans (hard and fuzzy), gmm,
dbscan, FedAvg (logreg mode fedavg, mlp), bagging xgboost's label and evaluation sums and bofrf. (Exact
logreg: tests/sim/test_logreg_job.py; histogram xgboost: tests/sim/test_xgbhist_job.py.)"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.kinds import stats
from fedpeer.kinds.cluster import dbscan as dj
from fedpeer.kinds.cluster import gmm as gj
from fedpeer.kinds.cluster import kmeans as kj
from fedpeer.kinds.linear import logreg, mlp
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.ml.cluster import mixture as mx
from fedpeer.protocols import epochs
from fedpeer.testing.members import member_keys, poison_entry, poisoned_sums, run_members

AMOUNT = st.integers(2**50, 2**64 - 2**50)       # beyond any member's declared count bound, either way
AT = st.floats(0.0, 1.0, exclude_max=True)        # which entry of the sum, as a fraction of its values
MEMBER = st.integers(0, 2)
SETTINGS = settings(max_examples=12, deadline=None)
D = 2                                             # features of the simulated sites

Layout = Callable[[str, np.ndarray], tuple[int, int, int]]   # (tag, vector) -> (floats, limbs, counts first)


def blobs(labelled: bool = False) -> list[Dataset]:
    """Three sites of 60-90 rows around three centres (each site mostly one), two features."""
    rng = np.random.default_rng(4)
    centres = np.array([[0.0, 0.0], [6.0, 1.0], [2.0, 7.0]])
    sites = []
    for i, rows in enumerate((60, 75, 90)):
        owner = np.where(rng.random(rows) < 0.8, i, rng.integers(0, 3, rows))
        X = np.ascontiguousarray(centres[owner] + rng.normal(scale=0.6, size=(rows, D)))
        X.setflags(write=False)
        y = (owner == 1).astype(np.int8)
        labels = np.array([str(v) for v in y]) if labelled else np.array([""] * rows)
        features = tuple(f"x{j}" for j in range(D))
        sites.append(Dataset(features, X, y if labelled else None, labels, 0,
                             schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * D)))
    return sites


def poison_one(which: int, at: float, amount: int, layout: Layout) -> Callable[[str, np.ndarray], Any]:
    """Poison the victim's `which`-th contribution (in the order it sends them), at entry `at`."""
    seen = itertools.count()

    def poison(tag: str, vector: np.ndarray) -> np.ndarray | None:
        if next(seen) != which:
            return None
        floats, limbs, first = layout(tag, vector)
        return poison_entry(vector, at, floats, limbs, amount, counts_first=first)
    return poison


def fails_everywhere(results: list, names: dict[bytes, str], poisoned: list[str]) -> None:
    assert poisoned, "the victim sent nothing to poison"
    assert not any(isinstance(r, dict) for r in results), f"a poisoned total was adopted ({poisoned})"
    for r in results:
        assert isinstance(r, ImplausibleTotal), (poisoned, r)
        text = str(r)
        assert text.startswith("secure sum '") and "a member's contribution is implausible" in text, text
        assert "\n" not in text and not any(name in text for name in names.values()), text


def run_kind(run: Callable[..., Any], sites: list[Dataset], params: dict, module: Any, member: int,
             poison: Callable[[str, np.ndarray], Any], prefix: str = "poison") -> tuple[list, dict, list[str]]:
    keys, names = member_keys(prefix, len(sites))
    with poisoned_sums(module, keys[member], poison) as poisoned:
        results = run_members(keys, lambda net, i, k: run(
            net.channel(k), params, JobContext(names[k], names, 2_000, data=sites[i])))
    return results, names, poisoned


# ---------------------------------------------------------------------------------------------

def stats_layout(tag: str, vector: np.ndarray) -> tuple[int, int, int]:
    floats = len(vector) // 3 if tag.endswith("moments") else D
    return floats, 3, 0


@SETTINGS
@given(which=st.integers(0, 1), at=AT, amount=AMOUNT, member=MEMBER)
def test_stats(which: int, at: float, amount: int, member: int) -> None:
    params = stats.KIND.check_params({"bins": 4, "secure_sum": "ring"})
    results, names, poisoned = run_kind(stats.run, blobs(labelled=True), params, stats, member,
                                        poison_one(which, at, amount, stats_layout))
    fails_everywhere(results, names, poisoned)


def cluster_layout(k: int, covariance: str = "full") -> Layout:
    """kmeans.Sums' vectors: fixed-point floats (4 limbs) then counts; how many floats, by tag."""
    nf, nc = cl.block_sizes(k, D)
    gf, _ = mx.stat_sizes(k, D, covariance)

    def layout(tag: str, vector: np.ndarray) -> tuple[int, int, int]:
        name = tag.rsplit("/", 1)[1]
        if name == "moments":
            return 2 * D, 4, 0
        if name.startswith("round"):
            return len(vector) // (4 * nf + nc) * nf, 4, 0
        if name == "init" or name.startswith("em"):
            return gf, 4, 0
        if name == "descriptions":
            return (len(vector) - 2) // 4, 4, 0
        return 0, 4, 0                       # dbscan/sizes: counts only
    return layout


def _inline_run(kind: Any) -> Callable[..., Any]:
    return lambda ch, params, ctx: kind.run_job(ch, params, ctx, kj._inline)


@SETTINGS
@given(which=st.integers(0, 3), at=AT, amount=AMOUNT, member=MEMBER, fuzzy=st.booleans())
def test_kmeans(which: int, at: float, amount: int, member: int, fuzzy: bool) -> None:
    params = kj.KIND.check_params({"k": 3, "n_init": 2, "seed": 1, "secure_sum": "ring",
                                   "fuzziness": 2.0 if fuzzy else 1.0})
    results, names, poisoned = run_kind(_inline_run(kj), blobs(), params, kj, member,
                                        poison_one(which, at, amount, cluster_layout(3)))
    fails_everywhere(results, names, poisoned)


@SETTINGS
@given(which=st.integers(0, 6), at=AT, amount=AMOUNT, member=MEMBER, covariance=st.sampled_from(["full", "diag"]))
def test_gmm(which: int, at: float, amount: int, member: int, covariance: str) -> None:
    params = gj.KIND.check_params({"k": 3, "n_init": 1, "seed": 1, "covariance": covariance, "secure_sum": "ring"})
    results, names, poisoned = run_kind(_inline_run(gj), blobs(), params, kj, member,
                                        poison_one(which, at, amount, cluster_layout(3, covariance)))
    fails_everywhere(results, names, poisoned)


@SETTINGS
@given(which=st.integers(0, 1), at=AT, amount=AMOUNT, member=MEMBER)
def test_dbscan(which: int, at: float, amount: int, member: int) -> None:
    params = dj.KIND.check_params({"eps": 1.0, "min_samples": 5, "components": 2, "local_clusters_max": 3,
                                   "secure_sum": "ring", "standardize": False, "eps_auto": False})
    results, names, poisoned = run_kind(_inline_run(dj), blobs(), params, kj, member,
                                        poison_one(which, at, amount, cluster_layout(3)))
    fails_everywhere(results, names, poisoned)


def linear_poison(which: int, at: float, amount: int) -> Callable[[str, np.ndarray], Any]:
    """logreg / mlp sums: moments [Σx (3 limbs) | Σx² (6 limbs) | counts], spread [Σ(x - mean)²],
    then every round [n w, n, loss (3 limbs) | evaluation counts]."""
    seen = itertools.count()

    def poison(tag: str, vector: np.ndarray) -> np.ndarray | None:
        if next(seen) != which:
            return None
        if tag.endswith("/moments"):
            part = min(int(at * 3), 2)
            sums, squares, counts = np.split(np.asarray(vector), [3 * D, 3 * D + 6 * D])
            pieces = [sums, squares, counts]
            limbs = (3, 6, 1)[part]
            pieces[part] = poison_entry(pieces[part], at * 3 - part, len(pieces[part]) // limbs if part < 2 else 0,
                                        limbs, amount)
            return np.concatenate(pieces)
        if tag.endswith("/spread"):
            return poison_entry(vector, at, D, 3, amount)
        floats = (len(vector) - COUNTS[0]) // 3
        return poison_entry(vector, at, floats, 3, amount)
    return poison


COUNTS = [2 * 100 + 2]      # a round's evaluation counts: eval_bins 100, binary


@SETTINGS
@given(which=st.integers(0, 4), at=AT, amount=AMOUNT, member=MEMBER, kind=st.sampled_from(["logreg", "mlp"]))
def test_fedavg(which: int, at: float, amount: int, member: int, kind: str) -> None:
    module = logreg if kind == "logreg" else mlp
    extra = {"mode": "fedavg", "C": 1.0} if kind == "logreg" else {"hidden_layer_sizes": "3"}
    params = module.KIND.check_params({"rounds": 3, "learning_rate": 0.1, "eval_bins": 100, "secure_sum": "ring",
                                       **extra})
    run = lambda ch, p, ctx: module.run_job(ch, p, ctx, offload=kj._inline)   # noqa: E731
    results, names, poisoned = run_kind(run, blobs(labelled=True), params, epochs, member,
                                        linear_poison(which, at, amount))
    fails_everywhere(results, names, poisoned)


def test_the_helpers_poison_what_they_say() -> None:
    """A top limb is poisoned for a value, the count itself for a count, and nothing else."""
    v = np.arange(8, dtype=np.uint64)
    out = poison_entry(v, 0.0, 2, 3, 2**31)             # value 0 of 2 (3 limbs each), then 2 counts
    assert list(np.flatnonzero(out != v)) == [2] and int(out[2]) == 2 + 2**31
    out = poison_entry(v, 0.99, 2, 3, 5)                 # the last count
    assert list(np.flatnonzero(out != v)) == [7] and int(out[7]) == 12
    out = poison_entry(v, 0.0, 1, 3, 5, counts_first=5)  # counts first: the first count
    assert list(np.flatnonzero(out != v)) == [0]
    out = poison_entry(v, 0.99, 1, 3, 5, counts_first=5)  # the value after them: its top limb
    assert list(np.flatnonzero(out != v)) == [7]


# ---------------------------------------------------------------------------------------------
# Bagging xgboost: the label counts and every round's evaluation

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@settings(max_examples=8, deadline=None)
@given(which=st.integers(0, 2), at=AT, amount=AMOUNT, member=MEMBER)
def test_bagging_xgboost(which: int, at: float, amount: int, member: int) -> None:
    import xgboost_experiment as exp
    from sklearn.datasets import load_breast_cancer

    from fedpeer.kinds.xgboost import evaluation as xeval
    from fedpeer.kinds.xgboost import kind as xkind

    raw = load_breast_cancer()
    features = tuple(n.replace(" ", "_") for n in raw.feature_names)
    y = (raw.target == 0).astype(np.int8)
    sites = [exp.dataset(raw.data[p], y[p], features) for p in exp.stratified_parts(y, 3, seed=1)]
    keys, names = member_keys("xgb", 3)
    checked = xkind.KIND.check_params({"mode": "bagging", "rounds": 3, "max_depth": 2, "nthread": 1,
                                       "eval_every": 1, "secure_sum": "ring"})     # labels, then 3 evaluations

    def layout(tag: str, vector: np.ndarray) -> tuple[int, int, int]:
        if tag == "xgb/labels":
            return 0, 3, 0                                   # counts only
        return 1, 3, len(vector) - 3                         # counts, then the log-loss (3 limbs)

    poison = poison_one(which, at, amount, layout)
    with poisoned_sums(xkind, keys[member], poison) as labels, poisoned_sums(xeval, keys[member], poison) as evals:
        results = run_members(keys, lambda net, i, k: xkind.run_job(
            net.channel(k), checked, JobContext(names[k], names, 10_000, data=sites[i]),
            xkind.Tools(offload=exp._inline)))
    fails_everywhere(results, names, labels + evals)


@settings(max_examples=8, deadline=None)
@given(which=st.integers(0, 1), at=AT, amount=AMOUNT, member=MEMBER)
def test_bofrf(which: int, at: float, amount: int, member: int) -> None:
    """BOFRF's roster (who holds which forest) and its trees' summed confusion matrices: counts."""
    from fedpeer.kinds.forest import bofrf

    params = bofrf.KIND.check_params({"n_estimators": 4, "max_depth": 3, "seed": 1, "secure_sum": "ring"})
    results, names, poisoned = run_kind(bofrf.run, blobs(labelled=True), params, bofrf, member,
                                        poison_one(which, at, amount, lambda tag, vector: (0, 1, 0)))
    fails_everywhere(results, names, poisoned)


def test_bofrf_confusion_wrapped_back_to_the_honest_total() -> None:
    """Issue 38, finding 2, from the attacker's side: a member adds 2^62 to each of one tree's
    four confusion counts, so the tree's int64 row sum wraps back to the honest total (4 * 2^62 =
    2^64) while every count stays below 2^63. Every member must refuse the total, not end `done`
    with the poisoned tree's MCC."""
    from fedpeer.kinds.forest import bofrf

    def poison(tag: str, vector: np.ndarray) -> np.ndarray | None:
        if not tag.endswith("confusion"):
            return None
        out = np.array(vector, dtype=np.uint64, copy=True)
        out[:4] += np.uint64(1 << 62)            # the first tree's tp, tn, fp, fn
        return out

    params = bofrf.KIND.check_params({"n_estimators": 4, "max_depth": 3, "seed": 1, "secure_sum": "ring"})
    results, names, poisoned = run_kind(bofrf.run, blobs(labelled=True), params, bofrf, 1, poison)
    assert poisoned == ["bofrf/confusion"]
    fails_everywhere(results, names, poisoned)
