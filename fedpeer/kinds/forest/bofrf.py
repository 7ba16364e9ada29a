"""`bofrf`: decentralized Boosting-based Federated Random Forest (docs/algorithms.md; thesis
Gençtürk's BOFRF thesis ch. 3–5), over the job's Channel, with secure sums only.

Every member runs the same coroutine:
1. split its rows into a training and a test part (stratified, seeded; `personalized` also
   keeps a validation part of the training rows) and train a scikit-learn random forest on the
   training part (min_samples_leaf >= 2 always);
2. send its forest, as validated arrays, to every other member, and receive theirs;
3. agree on the forests everybody holds: a secure sum of "I hold forest j" indicators; a forest
   counts only if every participant holds it — so all members use the same trees in the same
   order even when a member died while forests were travelling;
4. score every tree (its own and the foreign ones) on its own training rows: one confusion matrix
   per tree, (tp, tn, fp, fn); a tree abstains where it splits on a feature this site lacks;
5. secure-sum all matrices at once (eq. 3.5): no site sees another site's matrices. Forests of
   members lost during this sum are dropped;
6. weights alpha = MCC(C) if MCC > tau else 0 (eq. 3.6–3.7); local F_n = own trees, global F = all
   trees; score(x) = Σ alpha (2 p(x) - 1);
7. keep F if its AUC on the site's own test part beats F_n's, else F_n (eq. 3.11), store the kept
   model (validated arrays, no pickle) and report local RF, F_n, F (and BOPPID) metrics.

Instead of each forest travelling the ring with masked matrices (thesis §4.3), forests are sent
directly and all matrices go through one secure sum: the same totals reach the same sites, each
site's matrices stay hidden exactly as in the ring form, and one primitive does the summing.

The steps are pure functions (`prepare_site`, `score_site`, `finish_site`); the coroutine only
moves their inputs and outputs, and `reference()` runs the very same steps in one process with a
plain sum — a test checks that both give identical weights and predictions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedpeer.data import dataset as mldata
from fedpeer.errors import JobError, LocalProtocolError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, checked_total, site_seed
from fedpeer.jobs.params import SECURE_SUM, SECURE_SUM_COMPACT, seed, test_fraction
from fedpeer.kinds.forest import text
from fedpeer.kinds.forest.boppid import MESSAGE as BOPPID_MESSAGE
from fedpeer.ml.moments import whole_counts
from fedpeer.protocols.fixedpoint import encode_counts
from fedpeer.protocols.securesum.api import secure_sum
from fedpeer.runtime.channel import MalformedFrom, PeerDead, PeerRefused, SubChannel
from fedpeer.wire import frame as wire

FOREST_RECV_TIMEOUT_HOPS = 4        # waiting for a forest: this many hop timeouts
COUNT_MAX = 2**40                   # per-site confusion counts are row counts: far below this
TAU_GRID = tuple(round(0.05 * i, 2) for i in range(11))
GRID = {"max_depth": [None, 8], "min_samples_leaf": [2, 5]}   # grid_search's candidates (None: unlimited)

PARAMS = {
    "n_estimators": Param(int, 100, "trees in each site's random forest", low=1, high=2000),
    "max_depth": Param(int, 0, "maximum tree depth (0: as deep as peers accept, 64)", low=0, high=64),
    "min_samples_leaf": Param(int, 2, "smallest leaf; never below 2 (a 1-row leaf singles a person out)", low=2,
                              high=10_000),
    "grid_search": Param(bool, False, "pick max_depth and min_samples_leaf by 3-fold CV on the training part"),
    "test_fraction": test_fraction(0.25, 0.05, "share of each site's rows kept for its test part"),
    "validation_fraction": Param(float, 0.25, "personalized: share of the training part used to choose tau",
                                 low=0.05, high=0.9),
    "tau": Param(float, 0.2, "MCC threshold: trees at or below get weight 0", low=-1.0, high=1.0),
    "variant": Param(str, "base", "base | personalized (each site picks tau on its validation rows) | "
                     "clustered (sites grouped by characteristic vectors)",
                     choices=("base", "personalized", "clustered")),
    "clusters": Param(int, 2, "clustered: number of site clusters", low=1, high=100),
    "distance": Param(str, "euclidean", "clustered: distance between characteristic vectors",
                      choices=("euclidean", "manhattan")),
    "baseline": Param(str, "none", "also run a baseline side by side", choices=("none", "boppid")),
    "boppid_rounds": Param(int, 50, "BOPPID baseline: boosting rounds", low=1, high=1000),
    "seed": seed("seed of the splits and the forests"),
    "secure_sum": SECURE_SUM,
    "secure_sum_compact": SECURE_SUM_COMPACT,
}


# ---------------------------------------------------------------------------------------------
# Pure steps, shared by the job and the in-process reference.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SitePart:
    """One site's private state between steps: it never leaves the site."""

    fit: Any            # Dataset the forest is trained on
    validation: Any     # Dataset for choosing tau (personalized), else None
    test: Any           # Dataset the site reports on
    forest: Any         # fedpeer.ml.forest.trees.Forest of the site's own trees
    local_model: Any    # the sklearn forest (for the plain local RF metrics)
    # What the steps ask of a site's rows; ml/dask_bofrf.DaskBofrfPart answers the same on a Dask site.

    @property
    def rows(self) -> dict[str, int]:
        return {"train": int(self.fit.X.shape[0]), "test": int(self.test.X.shape[0])}

    def confusion(self, forest: Any) -> np.ndarray:
        """(T, 4) confusion matrices of every tree of `forest` on the training rows."""
        from fedpeer.ml.forest import bofrf as mb
        from fedpeer.ml.forest import treepredict

        return mb.confusion_per_tree(treepredict.predict_trees(forest, self.fit.X, self.fit.features), self.fit.y)

    def choose_tau(self, forest: Any, mcc: np.ndarray, grid: Sequence[float]) -> float:
        from fedpeer.ml.forest import bofrf as mb
        from fedpeer.ml.forest import treepredict

        val = self.validation
        return mb.choose_tau(treepredict.predict_trees(forest, val.X, val.features), val.y, mcc, grid=grid)

    def metrics(self, forest: Any, own: np.ndarray, alpha: np.ndarray) -> tuple[dict, dict, dict]:
        """binary_metrics of the local RF, F_n and F on the test rows."""
        from fedpeer.ml.forest import bofrf as mb
        from fedpeer.ml.forest.treepredict import predict_trees

        return mb.site_metrics(predict_trees(forest, self.test.X, self.test.features), self.test.y, own, alpha)


def policy_values(params: Mapping[str, Any]) -> dict[str, int]:
    """What a site's [policy.bofrf] limits are checked against: the depth and leaf size the forest
    is really trained with (prepare_site: 0 is trees.DEPTH_MAX; a grid search tries GRID's values,
    which ignore the parameters), and BOPPID's rounds only when that baseline runs."""
    from fedpeer.ml.forest import trees
    depth = params["max_depth"] or trees.DEPTH_MAX
    leaf = params["min_samples_leaf"]
    if params["grid_search"]:
        depth, leaf = trees.DEPTH_MAX, min(GRID["min_samples_leaf"])
    return {"max_depth": depth, "min_samples_leaf": leaf,
            "boppid_rounds": params["boppid_rounds"] if params["baseline"] == "boppid" else 0}


def prepare_site(dataset: Any, params: Mapping[str, Any], member: bytes) -> SitePart:
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import trees

    seed = site_seed(params["seed"], member)
    grid = GRID if params["grid_search"] else None
    # depth is capped at what peers accept on the wire (trees.DEPTH_MAX), so no forest is refused
    options = {"n_estimators": params["n_estimators"],
               "max_depth": min(params["max_depth"] or trees.DEPTH_MAX, trees.DEPTH_MAX),
               "min_samples_leaf": params["min_samples_leaf"], "seed": seed, "grid": grid}
    if getattr(dataset, "engine", "memory") == "dask":     # the same steps where the rows are
        from fedpeer.kinds.forest.dask import prepare
        return prepare(dataset, test_fraction=params["test_fraction"], seed=seed, options=options,
                       validation_fraction=params["validation_fraction"] if params["variant"] == "personalized"
                       else None)
    train, test = mldata.split_train_test(dataset, params["test_fraction"], seed=seed, stratify=True)
    validation = None
    if params["variant"] == "personalized":
        train, validation = mldata.split_train_test(train, params["validation_fraction"], seed=seed + 1, stratify=True)
    model = mb.train_local_forest(train.X, train.y, **options)
    return SitePart(fit=train, validation=validation, test=test,
                    forest=trees.from_sklearn(model, dataset.features), local_model=model)


def score_site(part: SitePart, forest: Any) -> np.ndarray:
    """This site's confusion matrices (T, 4) of every tree of `forest` on its training rows."""
    return part.confusion(forest)


def finish_site(part: SitePart, forest: Any, owners: np.ndarray, me_index: int, confusion: np.ndarray,
                params: Mapping[str, Any], tau: float | None = None) -> tuple[dict, Any, np.ndarray]:
    """From the summed matrices to this site's kept model and metrics.

    forest: every tree in agreed order; owners[t] = index of the member that trained tree t.
    Returns (result, kept forest, kept weights)."""
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import trees

    mcc = mb.mcc(confusion)
    if params["variant"] == "personalized":
        tau = part.choose_tau(forest, mcc, TAU_GRID)
    tau = params["tau"] if tau is None else tau
    alpha = mb.tree_weights(mcc, tau)
    own = owners == me_index
    local_rf, local, glob = part.metrics(forest, own, alpha)
    kept = mb.select_final(glob["auc"], local["auc"])
    keep = np.flatnonzero((alpha > 0) & (own if kept == "local" else True))
    result = {
        "local_rf": local_rf, "bofrf_local": local, "bofrf_global": glob,
        "final": {**(glob if kept == "global" else local), "model": kept},
        "tau": float(tau), "trees_total": int(len(alpha)), "trees_kept": int(len(keep)),
        "trees_weighted": int((alpha > 0).sum()), "rows": part.rows,
    }
    return result, trees.take(forest, keep), alpha[keep]


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ForestMsg:
    tag: str
    forest: Any          # fedpeer.ml.forest.trees.Forest, validated on arrival
    WAITING_FOR: ClassVar[str] = "forest"


@dataclass(frozen=True)
class ForestMissing:
    """The sender's word that its forest did not reach this receiver (refused as oversize, say):
    the receiver stops waiting for it at once. A member can only withdraw its own forest."""

    tag: str
    reason: str
    WAITING_FOR: ClassVar[str] = "word of an undelivered forest"


@dataclass(frozen=True)
class VectorMsg:
    tag: str
    vector: np.ndarray   # float64: a characteristic vector (clustered variant)
    WAITING_FOR: ClassVar[str] = "characteristic vector"


def _forest_field(value: Any, where: str) -> Any:
    from fedpeer.ml.forest import trees
    return trees.from_wire(value)


def _forest_body(m: ForestMsg) -> dict:
    from fedpeer.ml.forest import trees
    return {"tag": m.tag, "forest": trees.to_wire(m.forest)}


# The job's messages (with BOPPID's), registered by the job catalogue (fedpeer/kinds/catalog.py).
MESSAGES = (
    wire.declare("bofrf_forest", ForestMsg, {"tag": wire.v_str(256), "forest": _forest_field}, to_body=_forest_body),
    wire.declare("bofrf_forest_missing", ForestMissing, {"tag": wire.v_str(256), "reason": wire.v_str(512)}),
    wire.declare("bofrf_vector", VectorMsg, {"tag": wire.v_str(256),
                                             "vector": wire.v_array(100_000, frozenset({"<f8"}))},
                 to_body=lambda m: {"tag": m.tag, "vector": wire.encode_array(m.vector)}),
)


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------

async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    data = ctx.data
    ch.progress("training the local forest", 1, 5)
    part = await asyncio.to_thread(prepare_site, data, params, ch.me)
    cluster_info = None
    if params["variant"] == "clustered":
        ch, cluster_info = await _cluster(ch, part, params, ctx)
    result, kept, weights = await _federate(ch, part, params, ctx)
    if params["baseline"] == "boppid":
        ch.progress("BOPPID baseline", 5, 5)
        from fedpeer.kinds.forest.boppid import run_boppid
        result["boppid"] = await run_boppid(ch, part, params, ctx)
    if cluster_info:
        result["cluster"] = cluster_info
    result["_model"] = (kept, weights)     # taken out and stored by the registry's model hook
    return result


async def _federate(ch: Any, part: SitePart, params: Mapping[str, Any],
                    ctx: JobContext) -> tuple[dict, Any, np.ndarray]:
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import trees

    members = list(ch.members)
    me = members.index(ch.me)
    if len(members) == 1:      # a cluster of one: no federation, the site's own trees and matrices
        confusion = await asyncio.to_thread(score_site, part, part.forest)
        owners = np.zeros(part.forest.n_trees, dtype=np.int64)
        result, kept, weights = await asyncio.to_thread(finish_site, part, part.forest, owners, 0, confusion, params)
        result["participants"] = [ctx.names.get(ch.me, ch.me.hex()[:16])]
        return result, kept, weights
    ch.progress("exchanging forests", 2, 5)
    forests, evidence = await _exchange_forests(ch, part.forest, ctx)
    held = np.array([1 if m in forests else 0 for m in members], dtype=np.int64)
    roster = await secure_sum(ch, "bofrf/roster", encode_counts(held, len(members), count_max=1),
                              mode=params["secure_sum"], hop_timeout_ms=ctx.hop_timeout_ms,
                              compact=params.get("secure_sum_compact", False))
    held_by = checked_total("bofrf/roster", whole_counts, roster.total)
    checked_total("bofrf/roster", mb.check_roster, held_by, len(roster.participants))
    agreed = [m for i, m in enumerate(members) if int(held_by[i]) == len(roster.participants)]
    # every site derives the same list from the roster sum; `evidence` is what this site saw itself
    evidence["forests_left_out"] = [ctx.names.get(m, m.hex()[:16]) for m in members if m not in agreed]
    ch.progress("scoring every tree on this site's rows", 3, 5)
    forest, owners = _combine(forests, agreed, members)
    confusion = await asyncio.to_thread(score_site, part, forest)
    ch.progress("secure sum of confusion matrices", 4, 5)
    summed = await secure_sum(ch, "bofrf/confusion", encode_counts(confusion.ravel(), len(members), COUNT_MAX),
                              mode=params["secure_sum"], hop_timeout_ms=ctx.hop_timeout_ms,
                              compact=params.get("secure_sum_compact", False))
    if ch.me not in summed.participants:
        raise JobError("this site was left out of the secure sum")
    total = checked_total("bofrf/confusion", whole_counts, summed.total).reshape(-1, 4)
    checked_total("bofrf/confusion", mb.check_confusion, total, len(summed.participants), COUNT_MAX)
    survivors = [m for m in agreed if m in summed.participants]
    if survivors != agreed:     # forests of members lost during the sum are dropped
        keep = np.flatnonzero(np.isin(owners, [members.index(m) for m in survivors]))
        forest, owners, total = trees.take(forest, keep), owners[keep], total[keep]
    result, kept, weights = await asyncio.to_thread(finish_site, part, forest, owners, me, total, params)
    result["participants"] = [ctx.names.get(m, m.hex()[:16]) for m in survivors]
    result.update(evidence)
    return result, kept, weights


async def _exchange_forests(ch: Any, own: Any, ctx: JobContext) -> tuple[dict[bytes, Any], dict[str, Any]]:
    """Send our forest to every member and collect theirs; members that do not deliver are left out.

    A member the failure detector declares dead ends its wait at once too (PeerDead: named in
    `forests_undelivered`), and the secure sums then go on without it.
    A refusal is evidence and ends its wait at once (no FOREST_RECV_TIMEOUT_HOPS): a forest our
    gate refused (MalformedFrom) or that splits on other features is left out here, and the roster
    sum then leaves it out everywhere, while its sender stays in the sums (as for any missing
    forest). A sender whose forest did not get through (PeerRefused, or an unproven refusal such
    as an oversize frame) says so in a small ForestMissing, so the receiver stops waiting. Named in
    the result: `forests_refused` / `forests_undelivered` {sender: why} at the receiver and
    `own_forest_refused_by` {receiver: why} at the sender."""
    others = [m for m in ch.members if m != ch.me]
    name = lambda m: ctx.names.get(m, m.hex()[:16])  # noqa: E731
    evidence: dict[str, Any] = {"forests_refused": {}, "forests_undelivered": {},
                                           "own_forest_refused_by": {}}

    async def send(peer: bytes) -> None:
        try:
            await ch.send(peer, ForestMsg(tag="bofrf/forest", forest=own))
            return
        except PeerRefused as exc:
            evidence["own_forest_refused_by"][name(peer)] = reason = exc.reason
        except JobError as exc:
            reason = str(exc)   # unreachable, or refused without proof: the roster leaves it out
        except LocalProtocolError as exc:   # larger than this site may send (payload_bytes_max): ours to drop
            evidence["own_forest_refused_by"][name(peer)] = reason = f"not sent: {exc}"
        try:
            await ch.send(peer, ForestMissing(tag="bofrf/forest-missing", reason=reason[:512]))
        except JobError:
            pass

    async def receive(peer: bytes) -> tuple[bytes, Any] | None:
        try:
            msg = await _forest_or_word(ch, peer, FOREST_RECV_TIMEOUT_HOPS * ctx.hop_timeout_ms)
        except MalformedFrom as exc:
            evidence["forests_refused"][name(peer)] = exc.reason
            return None
        except PeerDead as exc:      # membership buried it: no FOREST_RECV_TIMEOUT_HOPS wait
            evidence["forests_undelivered"][name(peer)] = exc.detail
            return None
        except JobError:
            return None
        if isinstance(msg, ForestMissing):
            evidence["forests_undelivered"][name(peer)] = msg.reason
            return None
        if msg.forest.features != own.features:   # members agreed on one schema before the start
            evidence["forests_refused"][name(peer)] = "its forest splits on other features than the job's schema"
            return None
        return peer, msg.forest
    results = await asyncio.gather(*(send(p) for p in others), *(receive(p) for p in others))
    forests = {ch.me: own}
    forests.update(dict(r for r in results if r is not None))
    return forests, evidence


async def _forest_or_word(ch: Any, peer: bytes, timeout_ms: int) -> ForestMsg | ForestMissing:
    """`peer`'s forest, or its ForestMissing if that comes first; raises as `recv` does. The
    forest's own outcome wins a tie, so our gate's refusal (MalformedFrom) is the evidence kept."""
    forest = asyncio.ensure_future(ch.recv(ForestMsg, "bofrf/forest", src=peer, timeout_ms=timeout_ms))
    word = asyncio.ensure_future(ch.recv(ForestMissing, "bofrf/forest-missing", src=peer, timeout_ms=timeout_ms))
    try:
        await asyncio.wait((forest, word), return_when=asyncio.FIRST_COMPLETED)
        if forest.done() or word.exception() is not None:
            return (await forest)[1]
        return word.result()[1]
    finally:
        for wait in (forest, word):
            wait.cancel()
        await asyncio.gather(forest, word, return_exceptions=True)


def _combine(forests: Mapping[bytes, Any], agreed: Sequence[bytes], members: Sequence[bytes]) -> tuple[Any, np.ndarray]:
    from fedpeer.ml.forest import trees

    parts = [forests[m] for m in agreed]
    owners = np.concatenate([np.full(f.n_trees, members.index(m), dtype=np.int64) for m, f in zip(agreed, parts)])
    features = parts[0].features
    if any(f.features != features for f in parts):
        raise JobError("forests were trained on different feature lists")
    return trees.concat(parts), owners


async def _cluster(ch: Any, part: SitePart, params: Mapping[str, Any], ctx: JobContext) -> tuple[Any, dict]:
    """Clustered BOFRF (ch. 5): agree bounds, share characteristic vectors, cluster, return the
    channel of this site's cluster. Bounds are federation-wide mean ± 3 sd from a secure sum, so
    no site's minimum or maximum is revealed; the characteristic vectors themselves are shared
    (per-column means of normalised values — what the thesis' clustering needs). A member lost
    during the bounds sum is left out of the clustering; one lost after it fails the job cleanly
    (its vector never arrives, or sending to it fails)."""
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.moments import FIXED, check_moments, local_moments

    members = list(ch.members)
    X = part.fit.X
    moments = await secure_sum(ch, "bofrf/bounds", FIXED.encode(local_moments(X, part.fit.y), len(members)),
                               mode=params["secure_sum"], hop_timeout_ms=ctx.hop_timeout_ms,
                              compact=params.get("secure_sum_compact", False))
    totals = FIXED.decode(moments.total)
    d = X.shape[1]
    checked_total("bofrf/bounds", check_moments, totals, d)
    n = totals[0]
    mean = totals[2:2 + d] / n
    std = np.sqrt(np.maximum(totals[2 + d:] / n - mean * mean, 0.0))
    vector = mb.characteristic_vector(X, mean - 3 * std, mean + 3 * std)
    # every survivor agrees on the bounds sum's participants: cluster exactly those sites
    members = list(moments.participants)
    others = [m for m in members if m != ch.me]
    await asyncio.gather(*(ch.send(p, VectorMsg(tag="bofrf/vector", vector=vector)) for p in others))
    vectors = {ch.me: vector}
    for p in others:
        _, msg = await ch.recv(VectorMsg, "bofrf/vector", src=p,
                               timeout_ms=FOREST_RECV_TIMEOUT_HOPS * ctx.hop_timeout_ms)
        got = np.asarray(msg.vector, dtype=np.float64)
        if got.shape != vector.shape or not np.isfinite(got).all():
            # every site must cluster the same vectors: the job ends, blaming the sender (evidence)
            raise MalformedFrom(p, f"characteristic vector of shape {got.shape}, expected {vector.shape} finite values")
        vectors[p] = got
    labels = mb.farthest_first_clusters(np.stack([vectors[m] for m in members]), min(params["clusters"], len(members)),
                                        metric=params["distance"], first=0)
    mine = labels[members.index(ch.me)]
    cluster = tuple(m for m, lab in zip(members, labels) if lab == mine)
    info = {"cluster": int(mine), "members": [ctx.names.get(m, m.hex()[:16]) for m in cluster],
            "all": {ctx.names.get(m, m.hex()[:16]): int(lab) for m, lab in zip(members, labels)}}
    return SubChannel(ch, cluster), info


# ---------------------------------------------------------------------------------------------
# In-process reference: the same steps, a plain sum, no network.
# ---------------------------------------------------------------------------------------------

def reference(datasets: Sequence[Any], members: Sequence[bytes], params: Mapping[str, Any]) -> list[dict]:
    """BOFRF for `datasets[i]` held by `members[i]` (members in ring order = sorted keys), base or
    personalized variant, every member present. Returns each site's (result, kept forest, weights)."""
    assert list(members) == sorted(members), "members must be in ring order"
    parts = [prepare_site(ds, params, m) for ds, m in zip(datasets, members)]
    forest, owners = _combine({m: p.forest for m, p in zip(members, parts)}, list(members), list(members))
    total = sum(score_site(p, forest) for p in parts)
    return [finish_site(p, forest, owners, i, total, params) for i, p in enumerate(parts)]


def save_model(path: Any, model: tuple[Any, np.ndarray]) -> None:
    """The kept ensemble: validated tree arrays and their weights, no pickle (fedpeer.ml.forest.trees.save)."""
    from fedpeer.ml.forest import trees
    forest, weights = model
    trees.save(path, forest, weights=np.asarray(weights, dtype=np.float64))


def load_model(path: Any) -> tuple[Any, np.ndarray]:
    from fedpeer.ml.forest import trees
    forest, arrays = trees.load(path)
    weights = np.asarray(arrays["weights"], dtype=np.float64)
    if weights.shape != (forest.n_trees,) or not np.isfinite(weights).all():
        raise JobError(f"{path}: model weights do not match its trees")
    return forest, weights


def predict(model: tuple[Any, np.ndarray], X: np.ndarray, features: Sequence[str]) -> np.ndarray:
    """score(x) = Σ alpha (2 p(x) - 1); positive score = positive class."""
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import treepredict
    forest, weights = model
    return mb.ensemble_score(treepredict.predict_trees(forest, X, features), weights)


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with the kept ensemble: `score`, P(positive) as the weighted vote share
    (the α-weighted mean of the kept trees' P(positive), among the trees that vote on the row);
    `vote_sum`, the weighted vote Σ α (2 p − 1) the job scores with; `prediction`, 1 when the vote
    sum is positive (the same as score > 0.5)."""
    from fedpeer.ml.forest import bofrf as mb
    from fedpeer.ml.forest import treepredict

    forest, weights = load_model(path)
    proba = treepredict.predict_trees(forest, rows(forest.features), forest.features)
    votes, shares = mb.ensemble_score(proba, weights), mb.vote_share(proba, weights)
    return [{"row": i + 1, "score": float(p), "vote_sum": float(v), "prediction": int(v > 0)}
            for i, (p, v) in enumerate(zip(shares, votes))]


# [policy.bofrf]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "trees_max": Limit("n_estimators", 2000, "trees in each site's forest (n_estimators)"),
    "depth_max": Limit("max_depth", 64, "tree depth (max_depth; 0 and grid_search count as 64)"),
    "leaf_rows_min": Limit("min_samples_leaf", 2, "smallest leaf (min_samples_leaf; grid_search counts as 2)"),
    "boppid_rounds_max": Limit("boppid_rounds", 1000, "boosting rounds of the BOPPID baseline, when asked for"),
}


def dask_refused(params: Mapping[str, Any]) -> str | None:
    """The clustered variant and the BOPPID baseline read the rows in the daemon (kinds/forest/dask.py
    runs the others where the rows are)."""
    if params.get("variant", "base") != "clustered" and params.get("baseline", "none") == "none":
        return None
    return f"bofrf with variant = {params.get('variant')!r}, baseline = {params.get('baseline')!r}"


KIND = JobKind(name="bofrf", help="decentralized Boosting-based Federated Random Forest (secure sums only)",
               params=PARAMS, run=run, needs_data=True, binary_label=True, save_model=save_model,
               limits=LIMITS, in_effect=policy_values, describe=text.describe, site_table=text.site_table,
               predict=predict_file,
               messages=(*MESSAGES, BOPPID_MESSAGE),
               dask_support='bofrf (variant "base" or "personalized", baseline "none")', dask_refused=dask_refused)
