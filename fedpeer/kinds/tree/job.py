"""`tree`: one exact federated CART tree, every member's run over its Channel. The arithmetic is
fedpeer/kinds/tree/site.py (`TreeSite`, the step machines of fedpeer/ml/xgb/sketch.py and
fedpeer/ml/tree/cart.py); this module only moves their vectors through secure sums.

No leader: every member runs the same deterministic sequence of secure sums and derives the same
cut points and tree from the same totals (tags unique per sum and epoch E):
    tree/e<E>/sketch/<s>, s < steps  counts "rows <= threshold" -> cut points, the federation's rows
    tree/e<E>/d<D>                   the packed (node, feature, bin) class counts — or Σy, Σy², rows —
                                     of level D's built nodes -> that level's splits
    tree/e<E>/eval                   the tree on the sites' test parts (or, with test_fraction 0,
                                     their training rows) -> AUC, log-loss, accuracy (or RMSE, MAE)
(With dp_epsilon another sequence runs instead, one noised sum per level: fedpeer/kinds/tree/dp.py.)
The model file is the tree's canonical JSON (fedpeer/ml/tree/model.py), byte for byte the tree the
same pure functions grow on the pooled rows (`train_reference`).

A member lost (a sum completes without it, or fails and the failure detector declares it dead
within epochs.DEAD_WAIT_MS; fedpeer/protocols/epochs.py): every survivor starts epoch E + 1 and grows
the tree again from the first sketch sum, so the tree is exactly the pooled-rows tree of the
survivors' rows; `lost` names who left. A member left out of a sum fails alone
(`member_failure_aborts=False`); with fewer than two members left the job fails. With
`epoch_views` (the default; members of releases without it need false) the survivors agree on who
is lost from each other's views and a member that grew the tree waits for the others' word before
it returns, so none is left waiting in an old epoch (epochs.py, "Views").

Who learns what: every member learns the federation's training rows, the cut points (with
max_bin above the rows: every distinct value of every feature, not who holds it), and every
level's histograms — per node, feature and bin the rows of each class (or Σy, Σy²) — hence the
tree. No member sees another site's vector (the secure sum's guarantee).

Errors: a label beyond label_abs_max, a class outside `classes`, or a missing feature value ends
the job everywhere naming the cause (JobFailsEverywhere); so does a level too large for one secure
sum, or a total no honest members can give (`checked_total`: the sum and the check it failed,
naming no site — the secure sum hides whose contribution it was). The checks: the sketch's counts
(fedpeer/ml/xgb/sketch.py), every feature counting the same rows, every level's histograms
(fedpeer/ml/tree/cart.py `check_level`: counts within the rows, features agreeing on each node's
totals, the totals the parent's split said), the evaluation (fedpeer/ml/evaluation.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from fedpeer.data import dataset as mldata
from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import JobContext, JobFailsEverywhere, checked_total, site_seed
from fedpeer.ml import evaluation as evalcounts
from fedpeer.ml.moments import FIXED, whole_counts
from fedpeer.kinds.tree.site import TreeSite, bin_values, federation_rows
from fedpeer.ml.tree.cart import Growth, Layout, TreeParams, decode_level, grow_level, start_tree
from fedpeer.ml.tree.model import BinValues, Cart, finish_tree, model_bytes, predict_value, rules
from fedpeer.ml.xgb.sketch import sketch_advance, sketch_cuts, sketch_start
from fedpeer.protocols.epochs import Epochs
from fedpeer.protocols.epochs import Lost as _Lost
from fedpeer.protocols.fixedpoint import encode_counts
from fedpeer.protocols.securesum.wire import VECTOR_ENTRIES_MAX

TAG = "tree"
REGRESSION = "squared_error"
COUNT_MAX = 2**40                # evaluation counts are row counts
EVAL_HOP_TIMEOUT_MS = 5_000      # the evaluation sum is small
RULES_MAX = 1000                 # rules a result holds (the model holds every leaf)


def class_names(params: Mapping[str, Any]) -> list[str]:
    """The classes of a classification job: `classes` as given, or binary (negative, positive)."""
    if params["criterion"] == REGRESSION:
        return []
    names = [c.strip() for c in params["classes"].split(",") if c.strip()]
    if names and (len(names) < 2 or len(set(names)) != len(names)):
        raise JobError("tree: classes must be at least two distinct label values, comma-separated")
    return names or ["negative", "positive"]


def site_labels(dataset: Any, params: Mapping[str, Any]) -> np.ndarray:
    """What a site's rows are grown on: the label's numbers (regression), the index in `classes`,
    or 0/1 with [data] positive (no `classes`). DataError naming the problem."""
    if params["criterion"] == REGRESSION:
        try:
            y = np.array([float(v) for v in dataset.labels.tolist()], dtype=np.float64)
        except ValueError:
            raise DataError("tree: squared_error needs a numeric label column") from None
        if not np.isfinite(y).all():
            raise DataError("tree: squared_error needs finite labels")
        return y
    if not params["classes"].strip():
        if dataset.y is None:
            raise DataError("tree without classes is binary: set [data] positive (or give the job classes)")
        return np.asarray(dataset.y, dtype=np.int64)
    names = class_names(params)
    unknown = sorted(set(dataset.labels.tolist()) - set(names))
    if unknown:
        raise DataError(f"tree: label value(s) {unknown[:10]} are not among the job's classes {names}")
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[v] for v in dataset.labels.tolist()], dtype=np.int64)


def tree_params(params: Mapping[str, Any]) -> TreeParams:
    return TreeParams(criterion=params["criterion"], n_classes=max(2, len(class_names(params))),
                      max_depth=params["max_depth"], min_leaf_rows=params["min_leaf_rows"],
                      max_bin=params["max_bin"], ccp_alpha=params["ccp_alpha"],
                      label_abs_max=params["label_abs_max"])


class TreeJob:
    """One member's run of the job (module docstring)."""

    def __init__(self, ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: Callable[..., Any]) -> None:
        self.ch, self.params, self.ctx, self.offload = ch, params, ctx, offload
        self.p = tree_params(params)
        self.classes = class_names(params)
        self.epochs = Epochs(ch, TAG, params["secure_sum"], ctx.hop_timeout_ms, views=params["epoch_views"],
                             compact=params.get("secure_sum_compact", False))
        try:
            y = site_labels(ctx.data, params)
            data = replace(ctx.data, y=None if self.p.criterion == REGRESSION else y)
            if params["test_fraction"] > 0:
                fit, test = mldata.split_train_test(data, params["test_fraction"], site_seed(params["seed"], ch.me),
                                                    stratify=self.p.criterion != REGRESSION)
                self.fit, self.test = (fit.X, _labels(fit)), (test.X, _labels(test))
            else:
                self.fit = self.test = (data.X, y)
            self.local_test = None
            if ctx.test_data is not None:
                self.local_test = (ctx.test_data.X, site_labels(ctx.test_data, params))
        except DataError as exc:      # the job's labels do not fit this site's: not for the others to drop it
            raise JobFailsEverywhere(str(exc), here=True) from None
        self.rows = 0
        self.bins: BinValues | None = None

    @property
    def members(self) -> tuple[bytes, ...]:
        return self.epochs.members

    async def sum(self, name: str, vector: np.ndarray, hop_timeout_ms: int | None = None) -> tuple[str, np.ndarray]:
        """One secure sum over the current members; _Lost (next epoch, over the survivors) when it
        went without some; JobError with fewer than two members left."""
        out = await self.epochs.sum(name, vector, hop_timeout_ms=hop_timeout_ms)
        if out.lost:
            self.lose(out.lost)
            raise _Lost(out.lost)
        assert out.total is not None
        return out.tag, out.total

    async def compute(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A core step off the event loop; a site's DataError (a declared bound) ends the job everywhere."""
        try:
            return await self.offload(fn, *args)
        except DataError as exc:
            raise JobFailsEverywhere(str(exc), here=True) from None

    def lose(self, lost: tuple[bytes, ...]) -> None:
        """Every survivor, on the same `lost`: the next epoch over the others; JobError with fewer
        than two left."""
        self.epochs.new_epoch(lost)
        if len(self.members) < 2:
            raise JobError(f"fewer than two members left ({[self.name(m) for m in self.epochs.lost]} lost); "
                           "no federated tree")

    async def run(self) -> Cart:
        while True:
            try:
                tree = await self.grow()
                lost = await self.epochs.finish()     # with views: did every survivor grow it too?
                if not lost:
                    return tree
                self.lose(lost)                       # one's last sum failed: all grow it again
            except _Lost:
                continue

    async def grow(self) -> Cart:
        """The cut points (sketch.sketch_steps sums: 9 to 33), then one sum per level."""
        site = await self.compute(TreeSite, self.fit[0], self.fit[1], self.p, len(self.members))
        self.ch.progress("tree: cut points", 0, self.p.max_depth)
        sk, step = sketch_start(site.n_features, self.p.max_bin), 0
        while not sk.done:
            keys = sk.request()
            tag, total = await self.sum(f"sketch/{step}", await self.compute(site.sketch_vector, keys))
            sk = checked_total(tag, sketch_advance, sk, total.view(np.int64).reshape(keys.shape))
            step += 1
        self.rows = checked_total(tag, federation_rows, sk)
        cuts = sketch_cuts(sk)
        self.bins = bin_values(sk, cuts)
        await self.compute(site.set_cuts, cuts)
        layout, cp = Layout.of(cuts.counts()), self.p.cart()
        growth, depth = start_tree(layout, cp, self.rows), 0
        while not growth.done:
            entries = len(growth.build) * layout.slots * cp.channels
            if entries > VECTOR_ENTRIES_MAX:
                raise JobFailsEverywhere(f"tree: level {depth} would sum {entries} numbers, more than one secure sum "
                                         f"carries ({VECTOR_ENTRIES_MAX}); lower max_bin or max_depth")
            tag, total = await self.sum(f"d{depth}", await self.compute(site.level_vector, growth))
            growth = await self.compute(self._advance, tag, growth, total, layout, site)
            depth += 1
            self.ch.progress(f"tree: level {depth}", depth, self.p.max_depth)
        return finish_tree(growth, self.bins, self.p.ccp_alpha)

    def _advance(self, tag: str, growth: Growth, total: np.ndarray, layout: Layout, site: TreeSite) -> Growth:
        cp = self.p.cart()
        hist = checked_total(tag, decode_level, total, len(growth.build), layout, cp)
        grown = checked_total(tag, grow_level, growth, hist)
        site.after_level(grown)
        return grown

    async def evaluate(self, cart: Cart) -> dict | None:
        """The tree on the sites' test parts (training rows with test_fraction 0): one secure sum;
        None if it fails (the tree is final either way)."""
        X, y = self.test
        value = predict_value(cart, X)
        n = len(self.members)
        if self.p.criterion == REGRESSION:
            err = value - y
            vector = np.concatenate([encode_counts(np.array([len(y)]), n, COUNT_MAX),
                                     FIXED.encode(np.array([float(err @ err), float(np.abs(err).sum())]), n)])
        else:
            counts, loss = evalcounts.site_counts(y, _proba(value), self.params["eval_bins"])
            vector = np.concatenate([encode_counts(counts, n, COUNT_MAX), FIXED.encode(np.array([loss]), n)])
        try:
            tag, total = await self.sum("eval", vector, min(self.ctx.hop_timeout_ms, EVAL_HOP_TIMEOUT_MS))
        except (JobError, _Lost):
            return None
        return checked_total(tag, self._metrics, total)

    def _metrics(self, total: np.ndarray) -> dict:
        """The federation's figures from the summed evaluation; ValueError (naming the check) for a
        total no honest members can give (fedpeer/ml/evaluation.py `check_errors`, `check_counts`)."""
        if self.p.criterion == REGRESSION:
            rows, sums = int(whole_counts(total[:1])[0]), FIXED.decode(total[1:])
            evalcounts.check_errors(rows, float(sums[0]), float(sums[1]))
            if rows < 1:
                raise ValueError("the evaluation counts at least one row")
            return {"rmse": round(math.sqrt(max(sums[0], 0.0) / rows), 6), "mae": round(float(sums[1]) / rows, 6),
                    "rows": rows}
        k = len(total) - FIXED.limbs
        counts, loss = whole_counts(total[:k]), float(FIXED.decode(total[k:])[0])
        groups = 1 if len(self.classes) == 2 else len(self.classes)
        evalcounts.check_counts(counts, loss, groups, self.params["eval_bins"])
        return evalcounts.metrics(counts, loss, groups, self.params["eval_bins"])

    def name(self, key: bytes) -> str:
        return self.ctx.names.get(key, key.hex()[:16])


def _labels(part: Any) -> np.ndarray:
    """A split part's labels: its y (classification), or its label column's numbers (regression)."""
    if part.y is not None:
        return np.asarray(part.y, dtype=np.int64)
    return np.array([float(v) for v in part.labels.tolist()], dtype=np.float64)


def _proba(value: np.ndarray) -> np.ndarray:
    """Class shares as evaluation wants them: P(positive) for two classes, else every class's."""
    return value[:, 1] if value.shape[1] == 2 else value


def local_score(cart: Cart, X: np.ndarray, y: np.ndarray) -> dict:
    """The tree on rows every site holds ([data] test_csv), computed locally."""
    value = predict_value(cart, X)
    if cart.regression:
        err = value - y
        return {"rmse": float(np.sqrt(np.mean(err * err))), "mae": float(np.mean(np.abs(err))), "rows": int(len(y))}
    return {"auc": evalcounts.local_auc(y, _proba(value)), "rows": int(len(y))}


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                  offload: Callable[..., Any] | None = None) -> dict:
    """The kind's run(); `offload` runs the core's steps (asyncio.to_thread in the daemon; inline
    in simulations under virtual time)."""
    job = TreeJob(ch, params, ctx, offload or asyncio.to_thread)
    cart = await job.run()
    features = list(ctx.data.features)
    out: dict[str, Any] = {
        "criterion": params["criterion"], "max_depth": params["max_depth"], "max_bin": params["max_bin"],
        "min_leaf_rows": params["min_leaf_rows"], "ccp_alpha": params["ccp_alpha"],
        "exact_features": int(job.bins.exact.sum()) if job.bins is not None else 0,
    }
    return await finish_result(job, cart, rules(cart, features, job.classes, params["min_leaf_rows"]), out)


async def finish_result(job: TreeJob, cart: Any, every: list[str], out: dict[str, Any],
                        federated: bool = True) -> dict:
    """What every tree result holds after its mode's own fields `out`: the data's shape, the tree
    as scikit-learn's arrays and as rules, the model's hash, its federated score (and on [data]
    test_csv), the sums, members and the model itself. `federated` False (a DP job: an evaluation
    sum would release un-noised counts): no evaluation sum; this site scores its own test part
    locally (`local_test`, never sent)."""
    params, features = job.params, list(job.ctx.data.features)
    model = model_bytes(cart, features, job.classes)
    out.update({
        "features": features, "classes": job.classes, "federation_rows": job.rows,
        "rows": {"train": int(len(job.fit[1])), "test": int(len(job.test[1])) if params["test_fraction"] else 0},
        "n_leaves": cart.n_leaves, "depth": cart.depth, "n_nodes": cart.n_nodes, "rules": every[:RULES_MAX],
        "tree": {"feature": cart.feature.tolist(), "threshold": cart.threshold.tolist(), "left": cart.left.tolist(),
                 "right": cart.right.tolist(), "value": cart.value.tolist(),
                 "n_node_samples": cart.n_node_samples.tolist()},
        "model_sha256": hashlib.sha256(model).hexdigest(),
    })
    if len(every) > RULES_MAX:
        out["rules_omitted"] = len(every) - RULES_MAX
    key = "rmse" if cart.regression else "auc"
    if federated:
        fed = await job.evaluate(cart)
        on = "the sites' test parts" if params["test_fraction"] > 0 else "the sites' training rows"
        out["federated_eval"] = None if fed is None else {**fed, "on": on}
        out[key], out["score_source"] = (fed[key], f"federated, on {on}") if fed is not None else (None, None)
    else:
        on = "this site's own test part" if params["test_fraction"] > 0 else "this site's own training rows"
        local = await job.offload(local_score, cart, *job.test)
        out["federated_eval"], out["local_test"] = None, {**local, "on": on}
        out[key], out["score_source"] = local[key], f"{on} (not released)"
    if job.local_test is not None:
        local = await job.offload(local_score, cart, *job.local_test)
        out["test_csv"] = local
        out[key], out["score_source"] = local[key], "[data] test_csv"
    out["secure_sums"] = job.epochs.sums
    out["members"] = [job.name(m) for m in job.members]
    out["lost"] = [job.name(m) for m in job.epochs.lost]
    out["_model"] = model
    return out
