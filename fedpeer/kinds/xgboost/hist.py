"""`xgboost` with `mode = "histogram"`: exact federated XGBoost on secure-summed gradient
histograms (docs/algorithms.md, "Lossless histogram federated XGBoost"). The arithmetic
is fedpeer.ml.xgb.histrun's `HistSite` (one member's side) and the pure step machines of
fedpeer.ml.xgb.sketch / fedpeer.ml.xgb.histtree; this module only moves their vectors through secure sums.

No leader: every member runs the same deterministic sequence of secure sums and computes the
same cut points and trees from the same totals (one sum per arrow, tags unique per sum and epoch):
    xgbh/e<E>/labels                 label statistics -> base score
    xgbh/e<E>/sketch/<s>, s < steps  counts "rows <= threshold" -> cut points (fedpeer.ml.xgb.sketch)
    xgbh/e<E>/r<R>/c<K>/d<D>         the (node, feature, bin) sums of g, h, rows of level D of the
                                     tree of round R, class K -> that level's splits (a reduce-map
                                     under allreduce: each of the tree's owners sums one block of
                                     features, tree_owners)
then model = histboost.model_bytes(trees, base, F, p), the canonical xgboost JSON model, stored by
every member as bagging mode stores its model (so `fedpeer predict` works unchanged). With a
test part (`test_fraction` > 0) one last sum, xgbh/e<E>/eval, gives the federated AUC, log-loss
and accuracy of the final model on the sites' test parts. Every `eval_every` rounds before the
last, xgbh/e<E>/r<R>/eval does the same for the model so far (`eval_round_bins` score bins; on
the training rows when there is no test part): the result's `history`, one entry per evaluated
round, reported live as the job runs (the console's curves, `job show`). With `train_loss` each
of these sums also carries every member's training rows and training loss, read from the margins
it keeps (HistSite.margins: no prediction, no extra sum): `train_logloss` or `train_rmse`.

A member lost (why the model is still well defined): a sum completes over fewer members when one
drops out, and every survivor gets the same `participants`. When they are not the current member
set, every survivor drops what the lost member's rows were in, starts a new epoch E + 1 (fresh
tags, so no mask is ever reused) and goes on over the survivors only, from the least progress
any survivor made (the new epoch's first sum, `resume_point`: a member lost while it delivered a
sum can leave one survivor past that sum and another not):
* lost before the cut points are agreed (label or sketch sums): everything restarts over the
  survivors; the final model is exactly the pooled-rows model of the survivors' rows.
* lost later: the unfinished tree is dropped; the finished trees, the base score and the cut
  points are kept; every survivor rebuilds its margins from the finished trees (`HistSite.resume`)
  and grows the remaining trees over the survivors. The final model then equals
  `histrun.train_in_process(survivors' rows, start_trees=<the trees finished before the loss>)`
  except that base score and cut points are those of all the original members' rows: the first
  trees are the pooled model of every member's rows, the rest boost them on the survivors' rows.
A member left out of a sum (slow, cut off) fails alone (`member_failure_aborts=False`); with
fewer than two members left, the secure sum fails and so does the job. The secure sum decides
who is lost and how fast (fedpeer/protocols/securesum/api.py): a chunk lost with a killed member costs
the initiator (members + 1) hops before it re-runs the sum. Where the sum gives up instead — with
three members, a crash reported by one member against its ring successor is a dispute no ring
order can route around — every member waits up to DEAD_WAIT_MS for its failure detector: the
members it declares dead are lost as above (every survivor's detector declares the crashed one),
else the job fails with the sum's reason (this bookkeeping is fedpeer/protocols/epochs.py, shared
with logreg and FedAvg). With `epoch_views` (the default; members of releases without it need
false) the survivors also take the lost members of each other's views, a member restarted without
the job is lost when it refuses it, and a member that grew every tree waits for the others' word
before it returns, so no survivor is left waiting in an old epoch (epochs.py, "Views"; the tree,
logreg and mlp kinds likewise). Not covered: an initiator that dies while delivering a
total can leave the members that got it waiting for a takeover by one that did not (it fails).

A member restarted mid-job (`rejoin`, the default with views; members of releases without it
need false) asks to come back (epochs.py, "Rejoins"); the others take it back before their next
tree (not with fewer than REJOIN_TREES_LEFT_MIN trees left: it is told so), in a new epoch whose
resume point is where every member goes on from; there it gets the state so far (hist_rejoin.py:
rows, label statistics, base score, cut points, finished trees) from the first member that never
left, checks it against the digest of every member that never left, rebuilds its margins from the
trees and grows the next tree with the others. From then on the trees are grown over its rows
again: the final model is the same at every member, its first trees the pooled model of every
member, the trees grown while it was out those of the others' rows only.

Levels under `secure_sum = "allreduce"` (the default) go through the secure reduce-map instead
of a sum (`level_by_blocks`, fedpeer/protocols/securesum/reducemap.py): in each tree one member
in three (`tree_owners`, in turn from tree to tree) owns a block of features, gets their summed
histograms only, and sends everyone its block's best split of every node; the split taken is
the best over the blocks (histtree.decide_level), the model the same byte for byte.

Who learns what: every member learns the federation-wide totals of each sum (label counts, the
sketch's counts; under ring or pairwise, every level's histograms; under allreduce, in the
trees where it owns a block, the summed histograms of its block of features, and in every tree
each node's best split and sums) and hence the cut
points (each one a pooled row's exact value) and the trees; no member sees another site's vector
(the secure sum's guarantee: ring mode unless a site's two ring neighbours collude, pairwise and
allreduce unless all others collude).

Errors: a site whose gradients leave the declared fixed-point bounds, or whose counts could wrap
the sum, raises DataError naming the bound -> the job fails everywhere with that message
(JobFailsEverywhere), never a silent wrap-around. A total the core refuses (ValueError: a sum no
honest members can give) fails the job everywhere naming the sum and the check, and no site
(ImplausibleTotal: a member's contribution, nobody can tell whose).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import ImplausibleTotal, JobContext, JobFailsEverywhere, checked_total, site_seed
from fedpeer.kinds.xgboost.target import (
    check_eval,
    class_names,
    curve_metrics,
    encode_eval,
    eval_metrics,
    eval_sums,
    eval_vector,
    groups_of,
    is_regression,
    joined,
    model_score,
    site_labels,
    train_sums,
    with_train,
)
from fedpeer.ml.xgb import boosting
from fedpeer.ml.xgb.hist import FeatureBlocks, Packing, check_plausible, check_root, predictions
from fedpeer.ml.xgb.histboost import (
    HistParams,
    base_score_from_stats,
    check_root_gradient,
    check_label_stats,
    decode_ints,
    model_bytes,
    tree_features,
)
from fedpeer.ml.xgb.histrun import HistSite
from fedpeer.ml.xgb.histtree import (
    CANDIDATE_FIELDS,
    Growth,
    block_candidates,
    decide_level,
    finish_tree,
    grow_level,
    start_tree,
)
from fedpeer.ml.xgb.sketch import Cuts, sketch_advance, sketch_cuts, sketch_start
from fedpeer.ml.xgb.tree import _Tree
from fedpeer.protocols.epochs import DEAD_WAIT_MS, POLL_MS, Epochs  # noqa: F401  (the loss logic, shared: fedpeer/protocols/epochs.py)
from fedpeer.protocols.epochs import Lost as _Lost
from fedpeer.kinds.xgboost.hist_rejoin import REJOIN_TREES_LEFT_MIN, decode_state, encode_state
from fedpeer.protocols.securesum.api import SegmentRefused

TAG = "xgbh"
# A tree's blocks of features go to one member in MEMBERS_PER_OWNER (rounded up; tree_owners).
# A level's reduce-map takes 2 * owners * (n - 1) messages. At 5 daemons, 50 trees of 80,000 x
# 50, three interleaved runs: all 5 members as owners (40 messages a level) 13.0-13.8 CPU-s, 3
# owners 12.0-12.6, 2 owners 10.7-11.5 (BENCHMARKS.md). An owner receives (n - 1) / owners of a
# member's vector per level (2x at 5 daemons, 2.25x at 10): over a 100 Mbit/s link both ways
# the deepest level of that job (3.3 MB a member) then takes ~0.5 s to arrive, within the WAN
# targets. Over n trees every member owns equally many, so none sends or receives more in all.
MEMBERS_PER_OWNER = 3
EVAL_HOP_TIMEOUT_MS = 5_000      # the final evaluation sum is small


def hist_params(params: Mapping[str, Any], groups: int) -> HistParams:
    """The job's parameters as the core's HistParams; JobError for what histogram mode lacks."""
    if params["num_local_round"] != 1:
        raise JobError(f"histogram mode grows one tree per round and class (num_local_round must be 1, "
                       f"got {params['num_local_round']})")
    mapping = {"objective": params["objective"], "num_class": groups if groups > 1 else 0,
               "num_round": params["rounds"], "eta": params["eta"], "max_depth": params["max_depth"],
               "reg_lambda": params["reg_lambda"], "gamma": params["gamma"],
               "min_child_weight": params["min_child_weight"], "max_delta_step": params["max_delta_step"],
               "min_leaf_rows": params["min_leaf_rows"], "max_bin": params["max_bin"],
               "grad_abs_max": params["grad_abs_max"],
               "subsample": params["subsample"], "colsample_bytree": params["colsample_bytree"],
               "seed": params["seed"]}
    try:
        return HistParams.from_mapping(mapping)
    except ValueError as exc:
        raise JobError(f"histogram mode: {exc}") from None


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class HistJob:
    """One member's run of histogram mode (module docstring)."""

    def __init__(self, ch: Any, params: Mapping[str, Any], ctx: JobContext, fit: tuple[np.ndarray, np.ndarray],
                 groups: int, offload: Callable[..., Any] = asyncio.to_thread, site: Any = None) -> None:
        """`site`: this member's rows and state, built already (the Dask engine's DaskHistSite);
        else a HistSite over the rows `fit`."""
        self.ch, self.params, self.ctx, self.offload = ch, params, ctx, offload
        self.p = hist_params(params, groups)
        self.epochs = Epochs(ch, TAG, params["secure_sum"], ctx.hop_timeout_ms, views=params["epoch_views"],
                             rejoin=params.get("rejoin", False) and not params.get("dp_epsilon", 0.0),
                             compact=params.get("secure_sum_compact", False))
        self.needs_state = False               # back in the job: the state so far comes at the resume point
        try:
            self.site = site or HistSite(fit[0], fit[1], self.p, len(self.members), site_seed(params["seed"], ch.me))
        except DataError as exc:
            raise JobError(f"histogram mode: {exc}") from None
        self.n_features = self.site.n_features
        self.base: tuple[float, ...] | None = None
        self.cuts: Cuts | None = None
        self.rows = 0                          # the federation's training rows, from the label counts
        self.labels: np.ndarray | None = None  # the summed label statistics (histboost.label_stats)
        self._tree_at = (0, 0)                 # (round, class) of the tree being grown
        self.packing: Packing | None = None    # how levels' histograms travel, once rows are known
        self.trees: list[_Tree] = []
        self.history: list[dict] = []          # the evaluated rounds (evaluate_rounds)
        self.by_blocks = params["secure_sum"] == "allreduce"    # levels by the secure reduce-map
        self._parent: np.ndarray | None = None   # my block's histograms of the frontier's parents
        self.eval_round: Callable[[int], Any] | None = None

    @property
    def members(self) -> tuple[bytes, ...]:
        return self.epochs.members

    @property
    def lost(self) -> list[bytes]:
        return self.epochs.lost

    async def rejoin(self) -> None:
        """A restarted member: ask the others to take it back (epochs.py, "Rejoins"); JobError
        with the reason when they do not."""
        await self.epochs.ask()
        self.needs_state = True

    @property
    def sums(self) -> int:
        return self.epochs.sums

    async def sum(self, name: str, vector: np.ndarray, hop_timeout_ms: int | None = None) -> tuple[str, np.ndarray]:
        """One secure sum over the current members: (its tag, its total). _Lost if some member
        is not among its participants (every survivor sees the same participants), or if the sum
        failed and the failure detector declared some dead within DEAD_WAIT_MS (fedpeer/protocols/epochs.py)."""
        out = await self.epochs.sum(name, vector, hop_timeout_ms=hop_timeout_ms)
        if out.lost:
            self.epochs.new_epoch(out.lost)
            raise _Lost(out.lost)
        assert out.total is not None
        return out.tag, out.total

    async def compute(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a core step (off the event loop): a site's DataError (a declared bound) ends the job
        everywhere naming the bound."""
        try:
            return await self.offload(fn, *args)
        except DataError as exc:
            raise JobFailsEverywhere(str(exc), here=True) from None

    async def run(self) -> bytes:
        """Every tree, through as many epochs as members are lost; the model's bytes."""
        while True:
            try:
                if self.epochs.epoch:
                    await self.resume_point()
                if self.cuts is None:
                    await self.agree()
                await self.boost()
                lost = await self.epochs.finish()    # with views: did every survivor get here too?
                if not lost:
                    break
                self.epochs.new_epoch(lost)          # one's last sum failed: back to the resume point
            except _Lost:
                continue
        assert self.base is not None
        return model_bytes(self.trees, self.base, self.n_features, self.p)

    async def resume_point(self) -> None:
        """The first sum of a new epoch: where every survivor goes on from. A member lost while
        it delivered a sum's last messages can leave one survivor with that sum done (a tree, or
        the cut points, further) and another without it; each survivor adds a one-hot of its
        progress (0: no cut points yet, else 1 + its finished trees) and all go on from the least:
        they drop the trees beyond it (or the cut points and base score, at 0)."""
        progress = 0 if self.cuts is None else 1 + len(self.trees)
        vector = np.zeros(self.total_trees + 2, dtype=np.uint64)
        vector[self.total_trees + 1 if self.needs_state else progress] = 1    # back in: any progress will do
        tag, total = await self.sum("resume", vector)
        if int(total.sum()) != len(self.members) or int(total.max()) > len(self.members):
            raise ImplausibleTotal.of(tag, "the survivors' progress does not count each survivor once")
        least = int(np.flatnonzero(total)[0])
        if least == 0:
            self.cuts = self.base = None      # restart over the survivors from the first sum
            self.trees = []
            self.needs_state = False
            self.epochs.state_pending()
        elif self.needs_state:
            await self.take_state(least - 1)
        else:
            del self.trees[least - 1:]
            if self.epochs.joined:
                assert self.base is not None and self.cuts is not None and self.labels is not None
                await self.epochs.send_state(await self.offload(encode_state, self.rows, self.base, self.labels,
                                                                self.cuts, list(self.trees)))

    async def take_state(self, trees: int) -> None:
        """Back in the job: the state so far, `trees` trees, from the members that never left
        (epochs.receive_state checks it against their digests); JobError if it fails its checks."""
        state = decode_state(await self.epochs.receive_state(), self.p, self.n_features, trees)
        if self.site.rows > state.rows:
            raise JobError("the model so far counts fewer training rows than this site's own")
        await self.compute(self.site.set_cuts, state.cuts)
        self.packing = self.p.packing(state.rows, state.cuts.counts())
        await self.compute(self.site.set_packing, self.packing)
        self.rows, self.base, self.labels, self.cuts, self.trees = (state.rows, state.base, state.labels,
                                                                    state.cuts, state.trees)
        self.needs_state = False

    async def agree(self) -> None:
        """The base score and the cut points (1 + sketch.sketch_steps sums: 9 to 33)."""
        self.ch.progress("histogram mode: label counts and cut points", 0, self.total_trees)
        tag, total = await self.sum("labels", await self.compute(self.site.label_vector))
        self.rows = checked_total(tag, check_label_stats, decode_ints(total), self.p, len(self.members))
        if self.site.rows > self.rows:
            raise ImplausibleTotal.of(tag, "the federation's training rows are fewer than this member's own")
        base = checked_total(tag, base_score_from_stats, decode_ints(total), self.p)
        labels = decode_ints(total)
        sk, step = sketch_start(self.n_features, self.p.max_bin, self.rows), 0
        while not sk.done:
            keys = sk.request()
            tag, total = await self.sum(f"sketch/{step}", await self.compute(self.site.sketch_vector, keys))
            sk = checked_total(tag, sketch_advance, sk, decode_ints(total).reshape(keys.shape))
            step += 1
        cuts = sketch_cuts(sk)
        await self.compute(self.site.set_cuts, cuts)
        self.packing = self.p.packing(self.rows, cuts.counts())
        await self.compute(self.site.set_packing, self.packing)
        self.base, self.cuts, self.labels = base, cuts, labels

    @property
    def total_trees(self) -> int:
        return self.p.num_round * self.p.groups

    async def boost(self) -> None:
        """Grow the trees not finished yet, from the margins of the finished ones; after every
        round, the history's evaluation if it is an evaluation round."""
        assert self.base is not None and self.cuts is not None
        first_k = await self.compute(self.site.resume, self.base, list(self.trees))
        first_round = len(self.trees) // self.p.groups
        for r in range(first_round, self.p.num_round):
            if r > first_round or first_k == 0:      # resume() took a partial round's g, h already
                await self.compute(self.site.start_round)
            for k in range(first_k if r == first_round else 0, self.p.groups):
                await self.admit()
                await self.compute(self.site.start_tree, k, len(self.trees))
                tree = await self.grow(r, k)
                await self.compute(self.site.add_tree, tree, k)
                self.trees.append(tree)
                self.ch.progress(f"histogram mode: round {r + 1} of {self.p.num_round}", len(self.trees),
                                 self.total_trees)
            if self.eval_round is not None and r + 1 < self.p.num_round and _evaluated(r + 1, self.params):
                await self.eval_round(r + 1)

    async def admit(self) -> None:
        """Before a tree: members that asked to come back are taken back (a new epoch: _Lost
        sends every member to the resume point), or told why not (epochs.admit)."""
        left = self.total_trees - len(self.trees)
        refusal = None if left >= REJOIN_TREES_LEFT_MIN else \
            f"the job is too near its end ({left} tree(s) left; a member may rejoin with {REJOIN_TREES_LEFT_MIN} left)"
        taken = await self.epochs.admit(refusal)
        if taken:
            raise _Lost(taken)

    async def grow(self, r: int, k: int) -> _Tree:
        """One tree: one secure sum per level."""
        cuts = self.cuts
        assert cuts is not None
        self._tree_at = (r, k)
        growth = start_tree(cuts.counts(), self.p.split_params(),
                            tree_features(self.p, len(self.trees), cuts.n_features))
        depth = 0
        owners = [hashlib.sha256() for _ in self.members]     # each owner's results over the tree's levels
        blocks = self._tree_blocks(len(self.trees)) if self.by_blocks else None
        self._parent = None
        while not growth.done:
            name = f"r{r}/c{k}/d{depth}"
            if blocks is not None:
                growth = await self.level_by_blocks(name, growth, blocks, owners)
            else:
                tag, total = await self.sum(name, await self.compute(self.site.level_vector, growth))
                growth = await self.compute(self._advance, tag, growth, total)
            depth += 1
        if blocks is not None:      # did every owner send every member the same splits? (reducemap.py, step 4)
            lost = await self.epochs.check_results(f"r{r}/c{k}/check", [h.digest() for h in owners])
            if lost:
                self.epochs.new_epoch(lost)
                raise _Lost(lost)
        return finish_tree(growth, cuts)

    def _tree_blocks(self, tree: int) -> FeatureBlocks:
        """The blocks of features of tree number `tree`: `tree_owners` members own one each."""
        assert self.cuts is not None and self.packing is not None
        n = len(self.members)
        return FeatureBlocks.of(self.packing, self.cuts.n_features, self.cuts.n_slots, n, tree_owners(n, tree))

    async def level_by_blocks(self, name: str, growth: Growth, blocks: FeatureBlocks, owners: list[Any]) -> Growth:
        """One level by the secure reduce-map (fedpeer/protocols/securesum/reducemap.py): each of
        the tree's owners (tree_owners) gets the summed histograms of its block of features only,
        checks them and finds their best split of every node; every member gets every block's
        candidates and takes the best (histtree.decide_level: the split the search over all
        features picks). The summed histograms never travel: half the bytes of the all-reduce,
        the search shared among the owners. The owners' results are compared once per tree
        (`owners`: a hash of each member's results, in grow)."""
        nodes = len(growth.build)
        vector = await self.compute(self.site.level_vector, growth, True)      # block by block
        found: list[np.ndarray] = []

        def owner_fn(k: int, total: np.ndarray) -> np.ndarray:
            hist = blocks.decode(k, total, nodes)      # (the reduce-map asks owners of a feature or more only)
            check_plausible(hist, self.rows)
            if growth.build.tolist() == [0]:
                self._check_root(hist)
            candidates, frontier = block_candidates(growth, hist, self._parent, blocks.features[k])
            found.append(frontier)
            return candidates.view(np.uint64).ravel()

        tag = self.epochs.tag(name)
        try:
            out = await self.epochs.reduce_map(name, vector, blocks.bounds(nodes), owner_fn, check=False)
        except SegmentRefused as exc:
            raise ImplausibleTotal.of(tag, exc.reason) from None
        if out.lost:
            self.epochs.new_epoch(out.lost)
            raise _Lost(out.lost)
        assert out.results is not None
        for owner, digest in zip(owners, out.digests):
            owner.update(digest)
        grown = await self.compute(self._decide, tag, growth, blocks, out.results)
        self._parent = found[0][np.flatnonzero(grown.left[growth.frontier] >= 0)] if found else None
        return grown

    def _check_root(self, hist: np.ndarray) -> None:
        """The root's rows (check_root); in the first round, with every row in the tree, its
        gradient sum against the label statistics (histboost.check_root_gradient)."""
        every_row = self.p.subsample == 1.0 and not self.lost
        check_root(hist, self.rows, every_row)
        r, k = self._tree_at
        if every_row and r == 0:
            assert self.labels is not None and self.base is not None
            check_root_gradient(hist, self.labels, self.base, self.p, k)

    def _decide(self, tag: str, growth: Growth, blocks: FeatureBlocks, results: tuple[np.ndarray, ...]) -> Growth:
        grown = checked_total(tag, _decide_blocks, growth, blocks, results)
        self.site.after_level(grown)
        return grown

    def _advance(self, tag: str, growth: Growth, total: np.ndarray) -> Growth:
        cuts = self.cuts
        assert cuts is not None
        assert self.packing is not None
        hist = checked_total(tag, self.packing.decode, total, len(growth.build), cuts.n_features, cuts.n_slots)
        checked_total(tag, check_plausible, hist, self.rows)
        if growth.build.tolist() == [0]:
            checked_total(tag, self._check_root, hist)
        grown = checked_total(tag, grow_level, growth, hist)
        self.site.after_level(grown)
        return grown

    async def evaluate(self, model: bytes, test: tuple[np.ndarray, np.ndarray] | Callable[..., Any],
                       name: str = "eval", params: Mapping[str, Any] | None = None) -> dict | None:
        """A model on the sites' test parts: one secure sum; None if it fails. `test`: the rows,
        or (Dask engine) a function of (model, parties, params) giving this site's vector. A member
        lost in a round's evaluation is lost as in any sum (_Lost); in the final one the model is
        final either way and only its federated score is missing."""
        params = params or self.params
        train = await self.offload(self.site.train_total, _train_rows, dict(params)) if with_train(params) else None
        if callable(test):
            vector = await self.offload(test, model, len(self.members), params, train)
        else:
            pred = await self.offload(boosting.predict_proba, model, test[0], params["nthread"] or None)
            vector = eval_vector(test[1], pred, params, len(self.members), train)
        try:
            tag, total = await self.sum(name, vector, min(self.ctx.hop_timeout_ms, EVAL_HOP_TIMEOUT_MS))
        except JobError:
            return None
        except _Lost:
            if name == "eval":
                return None
            raise
        checked_total(tag, check_eval, total, params, self.rows)
        curve = curve_metrics(total, params)     # the final evaluation: also at the rounds' bins
        return {**eval_metrics(total, params), **({"curve": curve} if curve else {})}

    def evaluate_rounds(self, test: tuple[np.ndarray, np.ndarray] | Callable[..., Any]) -> None:
        """Evaluate the model so far every `eval_every` rounds on `test` (the history)."""
        params = {**self.params, "eval_bins": min(self.params["eval_round_bins"], self.params["eval_bins"])}

        async def eval_round(rnd: int) -> None:
            assert self.base is not None
            model = await self.offload(model_bytes, list(self.trees), self.base, self.n_features, self.p)
            entry: dict[str, Any] = {"round": rnd, "trees": len(self.trees)}
            metrics = await self.evaluate(model, test, f"r{rnd}/eval", params)
            entry.update(metrics if metrics is not None else {"eval_error": "the evaluation's secure sum failed"})
            self.history.append(entry)
            self.ch.progress(f"histogram mode: round {rnd} of {self.p.num_round}", len(self.trees),
                             self.total_trees, point=metrics and {"round": rnd, **metrics})
        self.eval_round = eval_round


def tree_owners(n: int, tree: int) -> tuple[int, ...]:
    """The members (indices) that own a block of features in tree number `tree`: one in
    MEMBERS_PER_OWNER (rounded up), the next ones in turn from tree to tree."""
    o = -(-n // MEMBERS_PER_OWNER)
    first = tree * o % n
    return tuple(sorted((first + j) % n for j in range(o)))


def _decide_blocks(growth: Growth, blocks: FeatureBlocks, results: tuple[np.ndarray, ...]) -> Growth:
    """Every block's candidates (uint64 from the wire) -> the level's splits; ValueError if an
    owner sent what no honest owner sends."""
    parts = []
    for k, r in enumerate(results):
        r = np.asarray(r)
        if r.dtype != np.uint64 or r.ndim != 1 or r.size % CANDIDATE_FIELDS:
            raise ValueError(f"the split candidates of block {k} have the wrong size")
        parts.append((r.view(np.int64).reshape(-1, CANDIDATE_FIELDS), blocks.features[k], blocks.features[k + 1]))
    return decide_level(growth, parts)


def _evaluated(rnd: int, params: Mapping[str, Any]) -> bool:
    """Is round `rnd` (from 1) an evaluation round: every `eval_every` (0: the last only)."""
    every = params["eval_every"]
    return rnd == params["rounds"] or (every > 0 and rnd % every == 0)


async def run_hist(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                   offload: Callable[..., Any] | None = None, rejoining: bool = False) -> dict:
    """The xgboost kind's run() for mode = "histogram"; `offload` runs the core's steps
    (asyncio.to_thread in the daemon; inline in simulations under virtual time). `rejoining`: this
    member restarted mid-job and asks to come back (module docstring)."""
    from fedpeer.kinds.xgboost.messages import Tools
    from fedpeer.kinds.xgboost.site import Site, score_result
    from fedpeer.kinds.xgboost.target import prepare

    site = Site(ch=ch, params=params, ctx=ctx, tools=Tools())
    if getattr(ctx.data, "engine", "memory") == "dask":
        if rejoining:
            raise JobError("a site on the Dask engine does not rejoin a running job")
        job, rows, test = await _dask_job(ch, params, ctx, site, offload or asyncio.to_thread)
        train = test
    else:
        prepare(site)              # the same seeded train/test split as bagging mode
        job = HistJob(ch, params, ctx, site.fit, site.groups, offload or asyncio.to_thread)
        rows = {"train": int(len(site.fit[1])), "test": int(len(site.test[1])) if params["test_fraction"] else 0}
        test, train = site.test, site.fit
    if params["test_fraction"] > 0 or not callable(train):   # (the Dask engine evaluates test parts only)
        job.evaluate_rounds(test if params["test_fraction"] > 0 else train)
    if rejoining:
        await job.rejoin()
    model = await job.run()
    info = boosting.model_info(model)          # canonical and well-formed, as any stored model
    p, names = params, ctx.names
    out: dict[str, Any] = {
        "mode": "histogram", "rounds": p["rounds"], "trees": info.n_trees,
        "model_sha256": boosting.model_sha256(model), "history": job.history,
        "base_score": job.base[0] if site.groups == 1 else list(job.base or ()),
        "features": list(ctx.data.features), "objective": p["objective"], "classes": class_names(p),
        "rows": rows,
        "members": [names.get(m, m.hex()[:16]) for m in job.members],
        "lost": [names.get(m, m.hex()[:16]) for m in job.lost], "secure_sums": job.sums,
        **({"rejoined": [names.get(m, m.hex()[:16]) for m in job.epochs.rejoined]} if job.epochs.rejoined else {}),
    }
    fed = await job.evaluate(model, test) if p["test_fraction"] > 0 else None
    if fed is not None:
        job.history.append({"round": p["rounds"], "trees": info.n_trees, **fed})
        curve = fed.pop("curve", None) or fed
        ch.progress(f"histogram mode: round {p['rounds']} of {p['rounds']}", job.total_trees, job.total_trees,
                    point={"round": p["rounds"], **{k: v for k, v in curve.items() if k != "eval_bins"}})
    score_result(out, p, fed, "the sites' test parts")
    if ctx.test_data is not None:
        X, y = ctx.test_data.X, site_labels(ctx.test_data, p)
        score_result(out, p, None, "", await job.offload(model_score, model, X, y, p, p["nthread"] or None))
    out["_model"] = model
    return out


async def _dask_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, site: Any,
                    offload: Callable[..., Any]) -> tuple[HistJob, dict, Callable[..., Any]]:
    """HistJob over the site's rows on its Dask cluster ([data] engine = "dask"): the same
    seeded split and row draws as `prepare` and HistSite, made where the rows are."""
    site.groups = groups_of(params)
    p, seed = hist_params(params, site.groups), site_seed(params["seed"], ch.me)
    split = (params["test_fraction"], seed, not is_regression(params)) if params["test_fraction"] > 0 else None
    try:
        from fedpeer.kinds.xgboost.dask import DaskHistSite

        member = await asyncio.to_thread(DaskHistSite, ctx.data, p, len(ch.members), seed,
                                         partial(site_labels, params=dict(params)), split)
    except DataError as exc:
        raise JobError(f"histogram mode: {exc}") from None
    job = HistJob(ch, params, ctx, None, site.groups, offload, site=member)

    def test_vector(model: bytes, parties: int, eval_params: Mapping[str, Any], train: Any = None) -> np.ndarray:
        total = member.test_total(_eval_rows, model, dict(eval_params))
        assert total is not None, "split_mask keeps at least one test row"
        return encode_eval(*joined(total, train, eval_params), parties)
    return job, {"train": member.rows, "test": member.test_rows if split else 0}, test_vector


def _train_rows(margins: np.ndarray, y: np.ndarray, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A member's (or a partition's) training loss at its margins, the model so far: `train_sums`
    (on its worker under the Dask engine)."""
    return train_sums(y, predictions(params["objective"], margins), params)


def _eval_rows(X: np.ndarray, y: np.ndarray, model: bytes, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A test partition's additive evaluation (on its worker): the memory engine's eval_vector before encoding."""
    return eval_sums(y, boosting.predict_proba(model, X, params["nthread"] or None), params)
