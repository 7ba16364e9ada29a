"""The decentralized BOFRF job (`fedpeer.kinds.forest.bofrf.run`) over the in-memory network.

Every member's coroutine runs in this one process over a `MemoryNetwork`, with real time (the
forests are trained in `asyncio.to_thread`, so virtual time would fire timeouts while threads
work) and short delays. Each test compares the members' results with `bofrf.reference`, which
runs the same pure steps with a plain sum: on the full federation, on the survivors of a crash,
or on each cluster. A failing case prints its seeds and parameters; it replays with the same
values (MemoryNetwork(keys, seed=...), params["seed"], the data seed).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.jobs.kind import JobContext
from fedpeer.kinds.forest import bofrf
from fedpeer.ml.forest import trees
from fedpeer.ml.forest import treepredict
from fedpeer.protocols.securesum.api import SumChunk
from fedpeer.protocols.securesum.wire import SumChange
from fedpeer.testing.memory import MemoryChannel, MemoryNetwork

HOP_MS = 1_000
N_EST = 10
JOB_TIMEOUT_S = 30          # a hanging job fails the test instead of the whole run
NET = {"delay_ms": (0.0, 2.0), "unreachable_ms": 100.0, "detect_ms": 200.0}
RESULT_BLOCKS = ("local_rf", "bofrf_local", "bofrf_global", "final", "tau", "trees_total", "trees_kept",
                 "trees_weighted", "rows")
FOREST_FIELDS = ("features", "tree_offsets", "left", "right", "feature", "threshold", "value")


# ---------------------------------------------------------------------------------------------
# Data, keys, parameters
# ---------------------------------------------------------------------------------------------

def _breast_cancer() -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer
    raw = load_breast_cancer()
    X = np.ascontiguousarray(raw.data, dtype=np.float64)
    y = (raw.target == 0).astype(np.int8)                    # malignant = positive
    return tuple(n.replace(" ", "_") for n in raw.feature_names), X, y


FEATURES, X_ALL, Y_ALL = _breast_cancer()


def _dataset(X: np.ndarray, y: np.ndarray) -> Dataset:
    """As benchmarks/bofrf_experiment.py builds a site's Dataset."""
    X, y = np.ascontiguousarray(X, dtype=np.float64), np.asarray(y, dtype=np.int8)
    X.setflags(write=False)
    y.setflags(write=False)
    labels = np.where(y == 1, "pos", "neg")
    return Dataset(FEATURES, X, y, labels, 0,
                   schema_fingerprint(FEATURES, [FEATURE_TYPE_FLOAT] * len(FEATURES)))


def make_sites(n: int, data_seed: int, noise: Sequence[float] = (),
               shift: Sequence[float] = ()) -> list[Dataset]:
    """n sites of random, disjoint breast-cancer rows; site i flips a share noise[i] of its labels
    (so trees differ in quality and tau matters) and adds shift[i] column sd to every feature."""
    rng = np.random.default_rng(data_seed)
    sd = X_ALL.std(axis=0)
    sites = []
    for i, rows in enumerate(np.array_split(rng.permutation(len(Y_ALL)), n)):
        rows = np.sort(rows)
        y = Y_ALL[rows].copy()
        flip = rng.random(len(y)) < (noise[i] if i < len(noise) else 0.0)
        y[flip] = 1 - y[flip]
        X = X_ALL[rows] + (shift[i] if i < len(shift) else 0.0) * sd
        sites.append(_dataset(X, y))
    return sites


def make_keys(n: int, salt: str) -> list[bytes]:
    """Member keys in ring order (sorted)."""
    return sorted(hashlib.sha256(f"{salt}-{i}".encode()).digest() for i in range(n))


def make_params(**over: Any) -> dict[str, Any]:
    return bofrf.KIND.check_params({"n_estimators": N_EST} | over)


# ---------------------------------------------------------------------------------------------
# Running the job
# ---------------------------------------------------------------------------------------------

class CrashOnTag:
    """A member that crashes when it is about to send its first message whose tag starts with
    `prefix`: it marks itself crashed in the network (peers' sends to it fail, the failure
    detector reports it dead after detect_ms) and never sends anything again."""

    def __init__(self, inner: MemoryChannel, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.crashed_on: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        if self.crashed_on is None and msg.tag.startswith(self.prefix):
            self.crashed_on = msg.tag
            self.inner.net.crash(self.inner.me)
        if self.crashed_on is not None:
            await asyncio.Event().wait()          # dead: blocks until cancelled
        await self.inner.send(dst, msg)


async def run_job(net: MemoryNetwork, sites: dict[bytes, Dataset], params: dict[str, Any],
                  names: dict[bytes, str], *, skip: Sequence[bytes] = (),
                  wrap: Callable[[bytes, MemoryChannel], Any] | None = None,
                  expect_done: Sequence[bytes] | None = None, hop_ms: int = HOP_MS) -> dict[bytes, dict]:
    """Start `run` for every member not in `skip`; wait for those of `expect_done` (default: all
    started) and return their results. Other members' tasks are cancelled at the end."""
    started = [k for k in net.members if k not in skip]
    expect = list(started if expect_done is None else expect_done)
    tasks = {}
    for key in started:
        ch = net.channel(key)
        if wrap is not None:
            ch = wrap(key, ch)
        ctx = JobContext(site_name=names[key], names=names, hop_timeout_ms=hop_ms, data=sites[key])
        tasks[key] = asyncio.create_task(bofrf.run(ch, params, ctx))
    try:
        async with asyncio.timeout(JOB_TIMEOUT_S):
            results = await asyncio.gather(*(tasks[k] for k in expect))
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    return dict(zip(expect, results))


def assert_same_forest(got: Any, want: Any, where: str) -> None:
    for field in FOREST_FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        same = a == b if field == "features" else np.array_equal(a, b)
        assert same, f"{where}: kept forest differs in {field}"


def assert_matches_reference(results: dict[bytes, dict], datasets: Sequence[Dataset], members: Sequence[bytes],
                             params: dict[str, Any], where: str) -> list[tuple[dict, Any, np.ndarray]]:
    """Every member's result (minus the job-only keys) and kept model equal the reference's for it."""
    expected = bofrf.reference(datasets, members, params)
    for key, (ref, ref_forest, ref_weights) in zip(members, expected):
        got = results[key]
        at = f"{where}, member {key.hex()[:8]}"
        for block in RESULT_BLOCKS:
            assert got[block] == ref[block], f"{at}: {block}: job {got[block]!r} != reference {ref[block]!r}"
        forest, weights = got["_model"]
        assert forest.n_trees == ref["trees_kept"] == len(weights), at
        assert_same_forest(forest, ref_forest, at)
        assert np.array_equal(weights, ref_weights), f"{at}: weights {weights} != reference {ref_weights}"
    return expected


# ---------------------------------------------------------------------------------------------
# 1. No faults
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, net_seed, data_seed, over", [
    (3, 1, 1, {"seed": 0, "tau": 0.45}),
    (4, 2, 1, {"seed": 1, "tau": 0.45, "secure_sum": "ring"}),
])
async def test_no_faults_equals_reference(n: int, net_seed: int, data_seed: int, over: dict) -> None:
    params = make_params(**over)
    where = f"n={n} net_seed={net_seed} data_seed={data_seed} params={over}"
    keys = make_keys(n, f"nofault-{net_seed}")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, data_seed, noise=(0.0, 0.1, 0.25, 0.35)[:n])
    net = MemoryNetwork(keys, seed=net_seed, **NET)
    results = await run_job(net, dict(zip(keys, datasets)), params, names)

    expected = assert_matches_reference(results, datasets, keys, params, where)
    for key in keys:
        assert results[key]["participants"] == [names[k] for k in keys], where
        assert results[key]["trees_total"] == n * N_EST, where
        assert "cluster" not in results[key], where
    # the case is not trivial: the threshold cuts some trees, and the sites do not all keep the same model
    assert any(r["trees_weighted"] < n * N_EST for r, _, _ in expected), f"{where}: tau cuts no tree"
    kinds = {r["final"]["model"] for r, _, _ in expected}
    assert kinds == {"local", "global"}, f"{where}: every site kept {kinds}"


# ---------------------------------------------------------------------------------------------
# 2. A member dead before the job starts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dead_index, net_seed", [(2, 3), (3, 4)])
async def test_member_dead_before_the_job(dead_index: int, net_seed: int) -> None:
    n = 4
    params = make_params(seed=5, tau=0.3)
    where = f"dead_index={dead_index} net_seed={net_seed} params_seed={params['seed']}"
    keys = make_keys(n, f"dead-{net_seed}")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 7, noise=(0.0, 0.1, 0.2, 0.3))
    dead = keys[dead_index]
    net = MemoryNetwork(keys, seed=net_seed, **NET)
    net.crash(dead)                                # at time 0: its coroutine never runs
    results = await run_job(net, dict(zip(keys, datasets)), params, names, skip=[dead])

    survivors = [k for k in keys if k != dead]
    assert_matches_reference(results, [d for k, d in zip(keys, datasets) if k != dead], survivors, params, where)
    for key in survivors:
        assert results[key]["participants"] == [names[k] for k in survivors], where
        assert names[dead] not in results[key]["participants"], where
        assert results[key]["trees_total"] == len(survivors) * N_EST, where


# ---------------------------------------------------------------------------------------------
# 3. A member that dies during the confusion-matrix secure sum
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dead_index, net_seed, mode", [(2, 5, "pairwise"), (3, 6, "ring")])
async def test_member_dies_during_confusion_sum(dead_index: int, net_seed: int, mode: str) -> None:
    n = 4
    params = make_params(seed=9, tau=0.3, secure_sum=mode)
    where = f"dead_index={dead_index} net_seed={net_seed} mode={mode} params_seed={params['seed']}"
    keys = make_keys(n, f"midsum-{net_seed}")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 8, noise=(0.0, 0.1, 0.2, 0.3))
    dead = keys[dead_index]
    wrapped: dict[bytes, CrashOnTag] = {}

    def wrap(key: bytes, ch: MemoryChannel) -> Any:
        if key != dead:
            return ch
        wrapped[key] = CrashOnTag(ch, "bofrf/confusion")
        return wrapped[key]

    net = MemoryNetwork(keys, seed=net_seed, **NET)
    survivors = [k for k in keys if k != dead]
    results = await run_job(net, dict(zip(keys, datasets)), params, names, wrap=wrap, expect_done=survivors)

    assert wrapped[dead].crashed_on is not None and wrapped[dead].crashed_on.startswith(
        f"bofrf/confusion/ss-{mode}/a1/"), f"{where}: crashed on {wrapped[dead].crashed_on}"
    # the dead member's forest went out and was agreed on: it was dropped after the sum
    assert any(src == dead and getattr(m, "tag", "") == "bofrf/forest" for src, _, m in net.sent), where
    assert_matches_reference(results, [d for k, d in zip(keys, datasets) if k != dead], survivors, params, where)
    for key in survivors:
        assert results[key]["participants"] == [names[k] for k in survivors], where
        assert results[key]["trees_total"] == len(survivors) * N_EST, where

    # the sum was re-run as attempt 2 over the survivors, with fresh masks
    prefix = f"bofrf/confusion/ss-{mode}/"
    # (compact messages, the default: each survivor is told who is dropped, by place in the members)
    restarts = [m for src, _, m in net.sent if isinstance(m, SumChange) and m.tag == prefix + "restart"]
    assert restarts and {m.attempt for m in restarts} == {2}, f"{where}: restarts {restarts}"
    assert all(m.dropped == (dead_index,) for m in restarts), where
    first = {a: [m.data for src, _, m in net.sent if src == keys[0] and isinstance(m, SumChunk)
                 and m.tag == f"{prefix}a{a}/c0"] for a in (1, 2)}
    assert len(first[1]) == len(first[2]) == 1, f"{where}: initiator's first chunks {first}"
    # same vector, new ring mask (and new pairwise masks): no entry is sent twice
    assert not np.any(first[1][0] == first[2][0]), f"{where}: a mask was reused across attempts"
    assert not any(src == dead and getattr(m, "tag", "").startswith(prefix) for src, _, m in net.sent), where


@pytest.mark.parametrize("dead_index, mode", [(2, "pairwise"), (0, "ring")])
async def test_member_killed_while_forests_travel_ends_the_wait_when_declared_dead(dead_index: int, mode: str) -> None:
    """Issue 12: a BOFRF member killed with kill -9 held the survivors for four hop timeouts
    (~80 s) although membership declared it dead after ~6 s. Here the hop timeout is 60 s: the
    survivors must finish soon after detect_ms, without the dead member's forest, and say why.
    The dead member is also, once, the secure sums' initiator: the next in ring order takes over."""
    n = 4
    params = make_params(seed=3, tau=0.3, secure_sum=mode)
    where = f"dead_index={dead_index} mode={mode}"
    keys = make_keys(n, f"killed-{dead_index}")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 5, noise=(0.0, 0.1, 0.2, 0.3))
    dead = keys[dead_index]

    def wrap(key: bytes, ch: MemoryChannel) -> Any:
        return CrashOnTag(ch, "bofrf/forest") if key == dead else ch

    net = MemoryNetwork(keys, seed=dead_index, **NET)
    survivors = [k for k in keys if k != dead]
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await run_job(net, dict(zip(keys, datasets)), params, names, wrap=wrap, expect_done=survivors,
                            hop_ms=60_000)
    took_s = loop.time() - started
    assert took_s < 20, f"{where}: survivors took {took_s:.1f} s; a hop timeout is 60 s"
    assert_matches_reference(results, [d for k, d in zip(keys, datasets) if k != dead], survivors, params, where)
    for key in survivors:
        assert results[key]["participants"] == [names[k] for k in survivors], where
        assert results[key]["forests_undelivered"] == {names[dead]: "declared dead by membership"}, where


# ---------------------------------------------------------------------------------------------
# 4. Clustered variant
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("net_seed, data_seed", [(7, 2)])
async def test_clustered_groups_shifted_sites(net_seed: int, data_seed: int) -> None:
    n = 4
    params = make_params(seed=13, tau=0.3, variant="clustered", clusters=2)
    where = f"net_seed={net_seed} data_seed={data_seed} params_seed={params['seed']}"
    keys = make_keys(n, f"cluster-{net_seed}")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    # sites 1 and 3 (in ring order) are shifted by 4 sd in every feature: the clusters interleave
    datasets = make_sites(n, data_seed, noise=(0.0, 0.1, 0.2, 0.0), shift=(0.0, 4.0, 0.0, 4.0))
    net = MemoryNetwork(keys, seed=net_seed, **NET)
    results = await run_job(net, dict(zip(keys, datasets)), params, names)

    groups = {0: [keys[0], keys[2]], 1: [keys[1], keys[3]]}    # label 0 = the cluster of the first centroid
    want_all = {names[k]: label for label, ks in groups.items() for k in ks}
    for label, members in groups.items():
        for key in members:
            info = results[key]["cluster"]
            assert info == {"cluster": label, "members": [names[k] for k in members], "all": want_all}, \
                f"{where}: member {names[key]}: {info}"
            assert results[key]["participants"] == [names[k] for k in members], where
            assert results[key]["trees_total"] == len(members) * N_EST, where
        assert_matches_reference(results, [datasets[keys.index(k)] for k in members], members, params,
                                 f"{where}, cluster {label}")


async def test_clustered_with_a_member_dead_from_the_start() -> None:
    """A member dead before the job is left out of the bounds sum, so the survivors cluster among
    themselves and finish (it used to fail every survivor: the vectors were sent to the dead)."""
    n = 5
    params = make_params(seed=13, tau=0.3, variant="clustered", clusters=2)
    keys = make_keys(n, "cluster-dead")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 2, noise=(0.0, 0.1, 0.2, 0.0, 0.1), shift=(0.0, 4.0, 0.0, 4.0, 0.0))
    dead = keys[3]
    net = MemoryNetwork(keys, seed=8, **NET)
    net.crash(dead)
    results = await run_job(net, dict(zip(keys, datasets)), params, names, skip=[dead])
    survivors = [k for k in keys if k != dead]
    alls = {tuple(sorted(results[k]["cluster"]["all"].items())) for k in survivors}
    assert len(alls) == 1, "every survivor must see the same clustering"
    mapping = dict(next(iter(alls)))
    assert names[dead] not in mapping and set(mapping) == {names[k] for k in survivors}
    assert mapping[names[keys[1]]] != mapping[names[keys[0]]], "the shifted site forms its own cluster"
    for key in survivors:
        members = [k for k in survivors if mapping[names[k]] == results[key]["cluster"]["cluster"]]
        assert results[key]["participants"] == [names[k] for k in members]


# ---------------------------------------------------------------------------------------------
# 5. Personalized variant
# ---------------------------------------------------------------------------------------------

def exact_auc(y: np.ndarray, score: np.ndarray) -> Fraction:
    """AUC as an exact fraction: P(score of a positive > score of a negative), ties count 1/2."""
    pos, neg = score[y == 1], score[y == 0]
    above = int((pos[:, None] > neg[None, :]).sum())
    tied = int((pos[:, None] == neg[None, :]).sum())
    return Fraction(2 * above + tied, 2 * len(pos) * len(neg))


def independent_tau(parts: Sequence[Any], me: int) -> tuple[float, int]:
    """The tau of the grid whose ensemble over every tree has the best validation AUC at site
    `me`, ties going to the smaller tau (fedpeer.ml.forest.bofrf.choose_tau's documented rule), and how
    many trees it weights; from the sites' prepared parts, with plain numpy and exact AUCs."""
    forest = trees.concat([p.forest for p in parts])
    total = np.zeros((forest.n_trees, 4), dtype=np.int64)
    for p in parts:
        pred = treepredict.predict_trees(forest, p.fit.X, p.fit.features) > 0.5
        pos = p.fit.y == 1
        total += np.stack([(pred & pos).sum(1), (~pred & ~pos).sum(1), (pred & ~pos).sum(1),
                           (~pred & pos).sum(1)], axis=1)
    tp, tn, fp, fn = (total[:, i].astype(float) for i in range(4))
    den = np.sqrt((tp + fp) * (tp + fn)) * np.sqrt((tn + fp) * (tn + fn))
    mcc = np.divide(tp * tn - fp * fn, den, out=np.zeros_like(den), where=den > 0)
    val = parts[me].validation
    votes = 2.0 * treepredict.predict_trees(forest, val.X, val.features) - 1.0
    best, best_auc = None, None
    for tau in sorted(bofrf.TAU_GRID):
        alpha = np.where(mcc > tau, mcc, 0.0)
        auc = exact_auc(val.y, alpha @ votes)
        if best_auc is None or auc > best_auc:
            best, best_auc = tau, auc
    return float(best), int((mcc > best).sum())


CHOOSE_TAU_FLOAT_TIES = (
    "fedpeer/ml/forest/bofrf.py choose_tau compares sklearn's float AUCs with `>`: exactly tied AUCs that "
    "differ in the last bit (here site 2: tau 0.25 and 0.35 both give AUC 13/18, sklearn returns "
    "0.7222222222222222 and 0.7222222222222223) go to the LARGER tau, against its documented tie rule")


@pytest.mark.parametrize("net_seed, data_seed, seed", [
    (8, 0, 0),
    (9, 1, 0),
    pytest.param(10, 4, 1),   # regression: tau ties 1 ulp apart once picked the larger tau
])
async def test_personalized_tau_per_site(net_seed: int, data_seed: int, seed: int) -> None:
    n = 3
    params = make_params(seed=seed, variant="personalized")
    where = f"net_seed={net_seed} data_seed={data_seed} params_seed={seed}"
    keys = make_keys(n, "personalized")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, data_seed, noise=(0.0, 0.15, 0.3))
    net = MemoryNetwork(keys, seed=net_seed, **NET)
    results = await run_job(net, dict(zip(keys, datasets)), params, names)

    assert_matches_reference(results, datasets, keys, params, where)
    parts = [bofrf.prepare_site(d, params, k) for d, k in zip(datasets, keys)]
    taus = []
    for i, key in enumerate(keys):
        tau, weighted = independent_tau(parts, i)
        got = results[key]
        assert got["tau"] == tau, f"{where}: site {i}: job tau {got['tau']} != best validation tau {tau}"
        assert got["trees_weighted"] == weighted, f"{where}: site {i}"
        assert got["rows"]["train"] == parts[i].fit.X.shape[0] < datasets[i].rows - got["rows"]["test"], \
            f"{where}: site {i}: no validation rows were held out"
        taus.append(got["tau"])
    assert len(set(taus)) > 1, f"{where}: every site chose tau {taus[0]}"


# ---------------------------------------------------------------------------------------------
# 6. A forest refused on evidence (issue 11 item 6): no waiting out hop timeouts
# ---------------------------------------------------------------------------------------------

SLOW_HOP_MS = 20_000        # the daemon's default hop: waiting out 4 of them would take 80 s
REFUSAL_WAIT_S_MAX = 10.0


def reference_without(datasets: Sequence[Dataset], members: Sequence[bytes], params: dict[str, Any],
                      left_out: bytes) -> list[tuple[dict, Any, np.ndarray]]:
    """Every member stays in the sums, but `left_out`'s trees are in nobody's forest."""
    parts = [bofrf.prepare_site(d, params, k) for d, k in zip(datasets, members)]
    agreed = [k for k in members if k != left_out]
    forest, owners = bofrf._combine({k: p.forest for k, p in zip(members, parts)}, agreed, list(members))
    total = sum(bofrf.score_site(p, forest) for p in parts)
    return [bofrf.finish_site(p, forest, owners, i, total, params) for i, p in enumerate(parts)]


def assert_results_equal(results: dict[bytes, dict], expected: list[tuple[dict, Any, np.ndarray]],
                         members: Sequence[bytes], where: str) -> None:
    for key, (ref, ref_forest, ref_weights) in zip(members, expected):
        got = results[key]
        for block in RESULT_BLOCKS:
            assert got[block] == ref[block], f"{where}, {key.hex()[:8]}: {block}: {got[block]!r} != {ref[block]!r}"
        forest, weights = got["_model"]
        assert_same_forest(forest, ref_forest, where)
        assert np.array_equal(weights, ref_weights), where


async def run_timed(net: MemoryNetwork, sites: dict[bytes, Dataset], params: dict[str, Any], names: dict[bytes, str],
                    **kw: Any) -> tuple[dict[bytes, dict], float]:
    import time
    started = time.monotonic()
    results = await run_job(net, sites, params, names, hop_ms=SLOW_HOP_MS, **kw)
    return results, time.monotonic() - started


async def test_refused_forest_is_named_and_left_out_at_once() -> None:
    """site2's gate refuses site1's forest: site2's receive ends at once (MalformedFrom), site1's
    send raises PeerRefused; the roster sum leaves site1's forest out everywhere; site1 stays in
    the sums. Every site's result equals the reference without site1's trees."""
    n = 4
    params = make_params(seed=3, tau=0.3)
    keys = make_keys(n, "refused-forest")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 3, noise=(0.0, 0.1, 0.2, 0.3))
    offender, refuser = keys[1], keys[2]

    def refuse(src: bytes, dst: bytes, msg: Any) -> str | None:
        forest = isinstance(msg, bofrf.ForestMsg)
        return "schema: tree depth above the limit" if forest and (src, dst) == (offender, refuser) else None

    net = MemoryNetwork(keys, seed=11, refuse=refuse, **NET)
    results, elapsed = await run_timed(net, dict(zip(keys, datasets)), params, names)

    assert elapsed < REFUSAL_WAIT_S_MAX, f"the refused forest was waited for: {elapsed:.1f} s"
    assert_results_equal(results, reference_without(datasets, keys, params, offender), keys, "refused forest")
    for key in keys:
        got = results[key]
        assert got["forests_left_out"] == [names[offender]], got["forests_left_out"]
        assert got["participants"] == [names[k] for k in keys if k != offender], got["participants"]
        want_refused = {names[offender]: "schema: tree depth above the limit"} if key == refuser else {}
        assert got["forests_refused"] == want_refused, (names[key], got["forests_refused"])
        want_by = {names[refuser]: "schema: tree depth above the limit"} if key == offender else {}
        assert got["own_forest_refused_by"] == want_by, (names[key], got["own_forest_refused_by"])


class RenamesFeatures:
    """A member whose forest (well-formed, so every gate passes it) splits on features that are
    not the job's schema: with it, every honest site used to fail the whole job in `_combine`."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        if isinstance(msg, bofrf.ForestMsg):
            from dataclasses import replace
            msg = bofrf.ForestMsg(tag=msg.tag, forest=replace(msg.forest, features=tuple(
                f"x{i}" for i in range(len(msg.forest.features)))))
        await self.inner.send(dst, msg)


async def test_forest_over_other_features_is_left_out_not_fatal() -> None:
    n = 3
    params = make_params(seed=4, tau=0.3)
    keys = make_keys(n, "renamed-forest")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 4, noise=(0.0, 0.1, 0.2))
    offender = keys[0]
    net = MemoryNetwork(keys, seed=12, **NET)
    results, elapsed = await run_timed(net, dict(zip(keys, datasets)), params, names,
                                       wrap=lambda k, ch: RenamesFeatures(ch) if k == offender else ch)
    assert elapsed < REFUSAL_WAIT_S_MAX
    assert_results_equal(results, reference_without(datasets, keys, params, offender), keys, "renamed features")
    for key in keys:
        assert results[key]["forests_left_out"] == [names[offender]]
        assert set(results[key]["forests_refused"]) == ({names[offender]} if key != offender else set())


class StumpsOnMissingFeature:
    """A member whose BOPPID model (well-formed on the wire) splits on a column nobody has."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        from fedpeer.kinds.forest.boppid import StumpsMsg
        if isinstance(msg, StumpsMsg):
            msg = StumpsMsg(tag=msg.tag, feature=np.full_like(msg.feature, len(FEATURES)), threshold=msg.threshold,
                            polarity=msg.polarity, alpha=msg.alpha, rows=msg.rows)
        await self.inner.send(dst, msg)


async def test_boppid_model_on_a_missing_feature_is_left_out_not_fatal() -> None:
    n = 3
    params = make_params(seed=6, tau=0.3, baseline="boppid", boppid_rounds=5)
    keys = make_keys(n, "bad-stumps")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 5, noise=(0.0, 0.1, 0.2))
    offender = keys[2]
    net = MemoryNetwork(keys, seed=13, **NET)
    results = await run_job(net, dict(zip(keys, datasets)), params, names,
                            wrap=lambda k, ch: StumpsOnMissingFeature(ch) if k == offender else ch)
    for key in keys:
        boppid = results[key]["boppid"]
        if key == offender:
            assert boppid["models_refused"] == {}, boppid
            continue
        assert list(boppid["models_refused"]) == [names[offender]], boppid["models_refused"]
        assert "feature" in boppid["models_refused"][names[offender]]
        assert names[offender] not in boppid["models_selected"]
    assert_matches_reference({k: r for k, r in results.items()}, datasets, keys, params, "bad stumps")


class OversizeTo:
    """The transport of `sender` fails its forest to `receiver` at once without proof (as an
    HTTP 413 for a frame above the receiver's message_bytes_max): nothing reaches the receiver."""

    def __init__(self, inner: MemoryChannel, receiver: bytes) -> None:
        self.inner, self.receiver = inner, receiver

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        if isinstance(msg, bofrf.ForestMsg) and dst == self.receiver:
            from fedpeer.runtime.channel import PeerUnreachable
            raise PeerUnreachable(dst, "HTTP 413 oversize")
        await self.inner.send(dst, msg)


async def test_undelivered_forest_is_announced_so_nobody_waits_for_it() -> None:
    n = 3
    params = make_params(seed=5, tau=0.3)
    keys = make_keys(n, "oversize-forest")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 6, noise=(0.0, 0.1, 0.2))
    sender, receiver = keys[0], keys[1]
    net = MemoryNetwork(keys, seed=14, **NET)
    results, elapsed = await run_timed(net, dict(zip(keys, datasets)), params, names,
                                       wrap=lambda k, ch: OversizeTo(ch, receiver) if k == sender else ch)
    assert elapsed < REFUSAL_WAIT_S_MAX, f"the receiver waited {elapsed:.1f} s for a forest that never came"
    assert_results_equal(results, reference_without(datasets, keys, params, sender), keys, "oversize forest")
    assert results[receiver]["forests_undelivered"] == {names[sender]: f"peer {receiver.hex()[:16]} unreachable: "
                                                                        "HTTP 413 oversize"}
    for key in keys:
        assert results[key]["forests_left_out"] == [names[sender]]


class NanVector:
    """A member whose characteristic vector (well-formed on the wire) holds NaN."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, dst: bytes, msg: Any) -> None:
        if isinstance(msg, bofrf.VectorMsg):
            msg = bofrf.VectorMsg(tag=msg.tag, vector=np.full_like(msg.vector, np.nan))
        await self.inner.send(dst, msg)


async def test_clustered_with_a_nan_vector_fails_blaming_its_sender() -> None:
    """Every site must cluster the same vectors, so a bad one ends the job, and the failure names
    the member that sent it (MalformedFrom, which the registry turns into blame on that member)."""
    from fedpeer.runtime.channel import MalformedFrom
    n = 3
    params = make_params(seed=13, tau=0.3, variant="clustered", clusters=2)
    keys = make_keys(n, "nan-vector")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 2, noise=(0.0, 0.1, 0.2))
    offender = keys[1]
    net = MemoryNetwork(keys, seed=15, **NET)
    honest = [k for k in keys if k != offender]
    with pytest.raises(MalformedFrom) as caught:
        await run_job(net, dict(zip(keys, datasets)), params, names, expect_done=honest,
                      wrap=lambda k, ch: NanVector(ch) if k == offender else ch)
    assert caught.value.peer == offender and "characteristic vector" in caught.value.reason


class ForestTooLarge(RenamesFeatures):
    """A member whose forest is larger than a message may be (a 2M-node forest): its channel's send
    refuses it locally (LocalProtocolError, as the daemon's links do past payload_bytes_max)."""

    async def send(self, dst: bytes, msg: Any) -> None:
        from fedpeer.errors import LocalProtocolError
        if isinstance(msg, bofrf.ForestMsg):
            raise LocalProtocolError("oversize", "payload of 80 MiB above payload_bytes_max")
        await self.inner.send(dst, msg)


async def test_a_forest_too_large_to_send_drops_its_sender_and_the_job_goes_on() -> None:
    """Every site ends done without the oversize forest (the audit: it failed the job everywhere)."""
    n = 3
    params = make_params(seed=5, tau=0.3)
    keys = make_keys(n, "oversize-forest")
    names = {k: f"site{i}" for i, k in enumerate(keys)}
    datasets = make_sites(n, 5, noise=(0.0, 0.1, 0.2))
    offender = keys[2]
    net = MemoryNetwork(keys, seed=13, **NET)
    results, elapsed = await run_timed(net, dict(zip(keys, datasets)), params, names,
                                       wrap=lambda k, ch: ForestTooLarge(ch) if k == offender else ch)
    assert elapsed < REFUSAL_WAIT_S_MAX, f"the oversize forest was waited for: {elapsed:.1f} s"
    assert_results_equal(results, reference_without(datasets, keys, params, offender), keys, "oversize forest")
    for key in keys:
        assert results[key]["forests_left_out"] == [names[offender]], results[key]
    assert set(results[offender]["own_forest_refused_by"]) == {names[k] for k in keys if k != offender}
