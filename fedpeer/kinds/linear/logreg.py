"""`logreg`, mode `exact`: federated L2 logistic regression whose coefficients are those of
scikit-learn's `LogisticRegression(C=C)` on the pooled, standardised rows. The
arithmetic is fedpeer/ml/linear/logistic.py; this module only moves its vectors through secure sums.

No leader: every member runs the same deterministic sequence of secure sums and takes the same
step from the same totals, so every member ends with the same coefficients (tags unique per sum
and epoch E):
    lr/e<E>/moments      [Σx, Σx² per column] (fixed point) ++ [rows per class] (counts)
                         -> the federation's mean, its class counts
    lr/e<E>/spread       [Σ(x - mean)² per column] -> the population standard deviation (it must
                         equal Σx² - (Σx)²/n: fedpeer/ml/moments.py `check_centred`)
    lr/e<E>/it<k>        [Σ loss, Σ gradient, Σ Hessian (newton: upper triangle)] at the k-th
                         candidate point -> the next candidate (linear.advance)
    lr/e<E>/eval         score histograms, correct predictions, log-loss sum of the final model
                         on the sites' held-out parts (`test_fraction`, 0.2 by default: each site's
                         stratified, seeded share, never trained on; 0: the training rows) ->
                         federated AUC / log-loss / accuracy, with the rows they are over
A member lost (a sum completes over fewer members than the job has, or fails and the failure
detector declares some member dead within epochs.DEAD_WAIT_MS; fedpeer/protocols/epochs.py): every
survivor sees the same participants, starts epoch E + 1 over the survivors (fresh tags) and fits
from the beginning, so the model is exactly the pooled-rows model of the survivors' rows; `lost`
names who left. A member left out of a sum (slow, cut off) fails alone
(`member_failure_aborts=False`) and is lost to the others. With fewer than two members left the
job fails. (Mode `fedavg` keeps its rounds across a loss: fedpeer/kinds/linear/fedavg.py.) With
`epoch_views` (the default, in mlp too; members of releases without it need false) the survivors
agree on who is lost from each other's views and a member that fitted waits for the others' word
before it returns, so none is left waiting in an old epoch (epochs.py, "Views").

Who learns what: every member learns the federation's row count, class counts, per-column mean
and standard deviation, and at every candidate point the federation-wide loss, gradient and (for
newton) Hessian sums — hence the coefficients. No member sees another site's vector (the secure
sum's guarantee). A site whose rows lack a class takes part as usual (its sums still add up); its
own result lists the classes it lacks (`classes_absent_here`), nobody else's does.

Errors: a sum or step that is not finite, or a site's terms beyond the fixed-point bound of the
secure sum, end the job with a message naming the parameter to change (C, or the feature values).
A class without rows at any site ends the job naming it.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.data.dataset import split_train_test
from fedpeer.jobs.kind import (ImplausibleTotal, JobContext, JobFailsEverywhere, JobKind, Limit, Param, checked_total,
                               site_seed)
from fedpeer.jobs.params import EPOCH_VIEWS_PARAM, SECURE_SUM_COMPACT, SECURE_SUM_LARGE, test_fraction
from fedpeer.kinds.linear import logreg_dp, text
from fedpeer.kinds.linear.fedavg import FEDAVG_PARAMS
from fedpeer.ml import evaluation as evalcounts
from fedpeer.ml.blas import one_blas_thread
from fedpeer.ml.linear import logistic as linear
from fedpeer.ml.moments import check_centred, check_columns, check_declared, whole_counts
from fedpeer.protocols.epochs import Epochs
from fedpeer.protocols.epochs import Lost as _Lost
from fedpeer.protocols.fixedpoint import FixedPoint, encode_counts

TAG = "lr"
MOMENTS = FixedPoint(frac_bits=32, limbs=3)     # column sums: |Σx| * parties < 2^63
SQUARES = FixedPoint(frac_bits=32, limbs=6)     # column sums of squares: |Σx²| * parties < 2^159 (any Σx that fits)
TERMS = FixedPoint(frac_bits=40, limbs=3)       # loss/gradient/Hessian sums: |v| * parties < 2^55 ≈ 3.6e16
COUNT_MAX = 2**40                               # rows per class at one site
EVAL_HOP_TIMEOUT_MS = 5_000
MODEL_VERSION = 1
FEATURES_MAX = 100_000                          # columns a stored model may hold (predict refuses more)

# logreg and mlp: the federated evaluation is over what no site trained on, as xgboost's
HELD_OUT = test_fraction(0.2, 0.0, "share of each site's rows kept out of training (stratified, drawn from seed): "
                         "the federated AUC / log-loss / accuracy are over these held-out parts; 0: over the "
                         "training rows")

PARAMS = {
    "mode": Param(str, "exact", "exact: Newton / L-BFGS on secure-summed gradients (and Hessians); the "
                  "coefficients are those of the pooled rows | fedavg: local SGD, row-weighted averages through "
                  "the secure sum each round (fedpeer/kinds/linear/fedavg.py)", choices=("exact", "fedavg")),
    "C": Param(float, 1.0, "inverse L2 regularisation strength, as scikit-learn's LogisticRegression C",
               low=1e-8, high=1e8),
    "solver": Param(str, "auto", f"newton: Newton steps on the summed Hessian (at most {linear.NEWTON_COEFS_MAX} "
                    "coefficients = classes x (features + 1)) | lbfgs: L-BFGS from summed gradients | auto: newton "
                    "when it fits", choices=("auto", "newton", "lbfgs")),
    "max_iter": Param(int, 100, "accepted steps at most (each costs one secure sum, more when the line search "
                      "halves the step)", low=1, high=10_000),
    "tol": Param(float, 1e-8, "stop when max |gradient| of the mean penalised log-loss is at most this",
                 low=1e-14, high=1.0),
    "classes": Param(str, "", "the label values, comma-separated, in class order: 3 or more -> multinomial; "
                     "2 -> binary, the second one positive; empty -> binary with [data] positive"),
    "eval_bins": Param(int, 1000, "score histogram bins for the federated AUC", low=10, high=100_000),
    "secure_sum": SECURE_SUM_LARGE,
    "epoch_views": EPOCH_VIEWS_PARAM,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    "test_fraction": HELD_OUT,
    **FEDAVG_PARAMS,
    **logreg_dp.PARAMS,         # differential privacy (fedpeer/kinds/linear/logreg_dp.py): off at dp_epsilon = 0
}


def class_names(params: Mapping[str, Any]) -> list[str]:
    names = [c.strip() for c in params["classes"].split(",") if c.strip()]
    if names and (len(names) < 2 or len(set(names)) != len(names)):
        raise JobError("logreg: classes must be at least two distinct label values, comma-separated")
    return names


def site_labels(dataset: Any, names: list[str]) -> np.ndarray:
    """Binary: 0/1 (positive = [data] positive, or the second of two `classes`); multinomial:
    the index in `classes`."""
    if not names:
        if dataset.y is None:
            raise DataError("logreg without classes is binary: set [data] positive (or give the job classes)")
        return np.asarray(dataset.y, dtype=np.int64)
    present = sorted(set(dataset.labels.tolist()))
    unknown = [v for v in present if v not in names]
    if unknown:
        raise DataError(f"label value(s) {unknown[:10]} are not among the job's classes {names}")
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[v] for v in dataset.labels.tolist()], dtype=np.int64)


def _groups(names: list[str]) -> int:
    return len(names) if len(names) > 2 else 1


def class_counts(y: np.ndarray, groups: int) -> np.ndarray:
    return np.bincount(y, minlength=max(groups, 2)).astype(np.int64)


class Member:
    """One member's run of the job (module docstring)."""

    KIND_NAME = "logreg"
    TERMS = TERMS

    def __init__(self, ch: Any, params: Mapping[str, Any], ctx: JobContext,
                 offload: Callable[..., Any] | None) -> None:
        self.ch, self.params, self.ctx = ch, params, ctx
        self.offload = offload or asyncio.to_thread
        self.names = class_names(params)
        self.groups = _groups(self.names)
        self.X = np.asarray(ctx.data.X, dtype=np.float64)
        self.epochs = Epochs(ch, TAG, params["secure_sum"], ctx.hop_timeout_ms, views=params["epoch_views"],
                             compact=params.get("secure_sum_compact", False))
        self.test: tuple[np.ndarray, np.ndarray] | None = None
        self.held: tuple[np.ndarray, np.ndarray] | None = None    # this site's held-out part (test_fraction)
        self.fed_held = 0                                         # the federation's held-out rows (scaling)
        try:
            self.y = site_labels(ctx.data, self.names)
            if ctx.test_data is not None:
                self.test = (np.asarray(ctx.test_data.X, dtype=np.float64), site_labels(ctx.test_data, self.names))
        except DataError as exc:      # the job's classes do not fit this site's labels: not for the others to drop it
            raise JobFailsEverywhere(f"{self.KIND_NAME}: {exc}", here=True) from None
        if params.get("test_fraction", 0) > 0:      # a site too small to split fails alone (DataError)
            train, held = split_train_test(replace(ctx.data, y=self.y), params["test_fraction"],
                                           seed=site_seed(params["seed"], ch.me), stratify=True)
            self.X, self.y = np.asarray(train.X, dtype=np.float64), np.asarray(train.y, dtype=np.int64)
            self.held = (np.asarray(held.X, dtype=np.float64), np.asarray(held.y, dtype=np.int64))

    @property
    def members(self) -> tuple[bytes, ...]:
        return self.epochs.members

    @property
    def lost(self) -> list[bytes]:
        return self.epochs.lost

    @property
    def sums(self) -> int:
        return self.epochs.sums

    async def sum(self, name: str, vector: np.ndarray, hop_timeout_ms: int | None = None) -> np.ndarray:
        """One secure sum over every current member; _Lost when it went without some (every
        survivor: the next epoch over the survivors; fedpeer/protocols/epochs.py)."""
        out = await self.epochs.sum(name, vector, hop_timeout_ms=hop_timeout_ms)
        if out.lost:
            self.lose(out.lost)
            raise _Lost(out.lost)
        assert out.total is not None
        return out.total

    def lose(self, lost: tuple[bytes, ...]) -> None:
        """Every survivor, on the same `lost`: the next epoch over the others; JobError with fewer
        than two left."""
        self.epochs.new_epoch(lost)
        if len(self.members) < 2:
            raise JobError(f"fewer than two members left ({[self.name(m) for m in self.lost]} lost); "
                           "no federated model")

    async def run(self) -> dict:
        while True:
            try:
                fitted = await self.fit()
                lost = await self.epochs.finish()     # with views: did every survivor fit it too?
                if not lost:
                    return fitted
                self.lose(lost)                       # one's last sum failed: all fit again
            except _Lost:
                continue

    async def scaling(self, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray]:
        """The moments and spread sums: (federation class counts, mean, scale, the total of the
        `extra` counts every member adds to the first sum); the first also counts the
        federation's held-out rows (`fed_held`)."""
        parties, d = len(self.members), self.X.shape[1]
        self.ch.progress(f"{self.KIND_NAME}: federated mean and class counts", 0, 0)
        counts = class_counts(self.y, self.groups)
        extra = np.zeros(0, dtype=np.int64) if extra is None else extra
        extra = np.concatenate([extra, [0 if self.held is None else len(self.held[1])]]).astype(np.int64)
        total = await self.sum("moments", np.concatenate([self.encode_columns(linear.moment_sums(self.X)),
                                                          self.encode_columns((self.X * self.X).sum(axis=0), SQUARES),
                                                          encode_counts(counts, parties, COUNT_MAX),
                                                          encode_counts(extra, parties, COUNT_MAX)]))
        split, end = d * MOMENTS.limbs, d * (MOMENTS.limbs + SQUARES.limbs)
        tag = self.epochs.tag("moments")
        summed = checked_total(tag, whole_counts, total[end:])
        checked_total(tag, check_declared, summed, parties * COUNT_MAX)
        fed_counts, extra_total = summed[:len(counts)], summed[len(counts):-1]
        self.fed_held = int(summed[-1])
        n = int(fed_counts.sum())
        self.check_classes(fed_counts)
        sums, squares = MOMENTS.decode(total[:split]), SQUARES.decode(total[split:end])
        checked_total(tag, check_columns, n, sums, squares)
        mean = sums / n
        total = await self.sum("spread", self.encode_columns(linear.centred_sums(self.X, mean)))
        centred = MOMENTS.decode(total)
        checked_total(self.epochs.tag("spread"), check_centred, n, sums, squares, centred)
        return fed_counts, mean, linear.scale_from(centred, n), extra_total

    async def fit(self) -> dict:
        if self.params["dp_epsilon"] > 0:
            return await logreg_dp.fit_dp(self)
        if self.params["mode"] == "fedavg":
            from fedpeer.kinds.linear.fedavg import fit_logreg
            return await fit_logreg(self)
        if self.params["groups"].strip():
            raise JobError("logreg: groups is for mode fedavg (exact mode sums over every member each iteration)")
        d = self.X.shape[1]
        fed_counts, mean, scale, _ = await self.scaling()
        n = int(fed_counts.sum())
        Z = linear.design(self.X, mean, scale)
        test_Z = linear.design(self.test[0], mean, scale) if self.test is not None else None
        problem = linear.Problem(d, self.groups, self.params["C"])
        try:
            fit = linear.start(problem, self.params["solver"], self.params["tol"], self.params["max_iter"], n)
        except ValueError as exc:
            raise JobError(f"logreg: {exc}") from None
        history: list[dict] = []
        while not fit.done:
            local = await self.offload(one_blas_thread, linear.local_terms, Z, self.y, fit.candidate, fit.hessian)
            vector = self.encode_terms(local, fit.evaluations, Z)
            total = await self.sum(f"it{fit.evaluations}", vector)
            before = len(fit.history)
            terms = TERMS.decode(total)
            tag = self.epochs.tag(f"it{fit.evaluations}")
            checked_total(tag, linear.check_terms, problem, terms, n, fit.hessian)
            try:
                fit = linear.advance(fit, terms)
            except np.linalg.LinAlgError:
                raise ImplausibleTotal.of(tag, "the summed Hessian can be solved") from None
            except linear.NonFinite as exc:
                raise JobFailsEverywhere(
                    f"logreg: at evaluation {fit.evaluations} {exc}: the fit diverges; lower C (stronger "
                    "regularisation) or rescale the extreme feature values") from None
            if len(fit.history) > before:
                entry = dict(fit.history[-1])
                if test_Z is not None and self.test is not None:
                    entry["test_auc"] = evalcounts.local_auc(self.test[1], linear.probabilities(test_Z, fit.W))
                history.append(entry)
                self.ch.progress(f"logreg: iteration {fit.iterations}", fit.iterations, self.params["max_iter"],
                                 point={k: v for k, v in entry.items() if isinstance(v, (int, float))})
        return await self.result(fit, mean, scale, fed_counts, history, Z)

    def check_classes(self, fed_counts: np.ndarray) -> None:
        names = self.names or ["negative", "positive"]
        empty = [names[k] for k in range(len(fed_counts)) if fed_counts[k] == 0]
        if empty:
            raise JobFailsEverywhere(f"logreg: class(es) {empty} have no rows at any site; remove them from "
                                     "classes (or check [data] positive)")

    def encode_columns(self, sums: np.ndarray, fixed: FixedPoint = MOMENTS) -> np.ndarray:
        """Per-column sums for the secure sum; a column beyond the fixed point's bound is named."""
        parties = len(self.members)
        bound = fixed.max_abs(parties)
        if np.isfinite(sums).all() and (np.abs(sums) <= bound).all():
            return fixed.encode(sums, parties)
        j = int(np.argmax(~np.isfinite(sums) | (np.abs(sums) > bound)))
        raise JobFailsEverywhere(
            f"logreg: feature {self.ctx.data.features[j]!r} holds values too large for the secure sum of its "
            f"column sums (|sum| must stay below {bound:.3g} over {parties} sites): rescale that feature "
            "(e.g. change its units or take its logarithm)", here=True)

    def encode_terms(self, local: np.ndarray, evaluation: int, Z: np.ndarray) -> np.ndarray:
        try:
            return TERMS.encode(local, len(self.members))
        except DataError as exc:
            column = int(np.abs(Z[:, :-1]).max(axis=0).argmax()) if Z.shape[0] else 0
            feature = self.ctx.data.features[column]
            raise JobFailsEverywhere(
                f"logreg: this site's loss/gradient at evaluation {evaluation} leaves the secure sum's bound "
                f"({exc}); lower C (stronger regularisation) or rescale the extreme values of feature "
                f"{feature!r} (up to {float(np.abs(Z[:, column]).max()):.3g} standard deviations from the "
                "mean here)", here=True) from None

    @property
    def eval_y(self) -> np.ndarray:
        """The labels the federated evaluation is over: the held-out part's, else the training rows'."""
        return self.y if self.held is None else self.held[1]

    def eval_design(self, mean: np.ndarray, scale: np.ndarray, train: np.ndarray) -> np.ndarray:
        """The standardised rows the evaluation scores (`train`: the training rows', already built)."""
        return train if self.held is None else linear.design(self.held[0], mean, scale)

    @property
    def evaluated_on(self) -> str:
        return "the sites' training rows" if self.held is None else "the sites' held-out parts (test_fraction)"

    def eval_counts_of(self, proba: np.ndarray) -> tuple[np.ndarray, float]:
        return eval_counts(self.eval_y, proba, self.params["eval_bins"])

    def metrics_of(self, counts: np.ndarray, loss: float) -> dict:
        return eval_metrics(counts, loss, self.groups, self.params["eval_bins"])

    async def evaluate(self, proba: np.ndarray, bins: int) -> dict | None:
        """The federated metrics of `proba` (scores of `eval_y`) with their rows; None if the sum failed."""
        counts, loss = eval_counts(self.eval_y, proba, bins)
        n = len(self.members)
        vector = np.concatenate([encode_counts(counts, n, COUNT_MAX), MOMENTS.encode(np.array([loss]), n)])
        try:
            total = await self.sum("eval", vector, min(self.ctx.hop_timeout_ms, EVAL_HOP_TIMEOUT_MS))
        except (JobError, _Lost):
            return None          # the model is final either way; only its federated score is missing
        tag = self.epochs.tag("eval")
        summed = checked_total(tag, whole_counts, total[:len(counts)])
        loss = float(MOMENTS.decode(total[len(counts):])[0])
        checked_total(tag, evalcounts.check_counts, summed, loss, self.groups, bins)
        return eval_metrics(summed, loss, self.groups, bins)

    async def result(self, fit: linear.Fit, mean: np.ndarray, scale: np.ndarray, fed_counts: np.ndarray,
                     history: list[dict], Z: np.ndarray) -> dict:
        assert fit.W is not None and fit.g is not None
        coef, intercept = linear.unstandardise(fit.W, mean, scale)
        names, features = self.names, list(self.ctx.data.features)
        labels = names or ["negative", "positive"]
        proba = linear.probabilities(self.eval_design(mean, scale, Z), fit.W)
        here = class_counts(self.y, self.groups)
        out: dict[str, Any] = {
            "mode": "exact", "solver": fit.solver, "C": self.params["C"], "status": fit.status,
            "iterations": fit.iterations,
            "evaluations": fit.evaluations, "secure_sums": self.sums, "grad_max": float(np.abs(fit.g).max()),
            "features": features, "classes": names, "coef": coef.tolist(), "intercept": intercept.tolist(),
            "coef_standardised": fit.W[:, :-1].tolist(), "intercept_standardised": fit.W[:, -1].tolist(),
            "mean": mean.tolist(), "scale": scale.tolist(), "rows": int(fed_counts.sum()),
            "test_rows": self.fed_held, "test_fraction": self.params.get("test_fraction", 0.0),
            "class_counts": {labels[k]: int(c) for k, c in enumerate(fed_counts)},
            "classes_absent_here": [labels[k] for k, c in enumerate(here) if c == 0],
            "history": history, "members": [], "lost": [],
            "sklearn": linear.sklearn_export(coef, intercept, names, features),
            "federated_eval": None, "auc": None, "auc_source": None,
        }
        fed = await self.evaluate(proba, self.params["eval_bins"])
        out["secure_sums"] = self.sums
        out["members"], out["lost"] = self.member_names()
        if fed is not None:
            out["federated_eval"] = {**fed, "on": self.evaluated_on}
            out["auc"], out["auc_source"] = fed["auc"], f"federated, on {self.evaluated_on}"
        if self.test is not None:
            test_auc = evalcounts.local_auc(self.test[1], linear.predict_proba(coef, intercept, self.test[0]))
            out["test_csv"] = {"auc": test_auc, "rows": int(len(self.test[1]))}
            out["auc"], out["auc_source"] = test_auc, "[data] test_csv"
        out["_model"] = {"coef": coef, "intercept": intercept, "features": features, "classes": names}
        return out

    def name(self, key: bytes) -> str:
        return self.ctx.names.get(key, key.hex()[:16])

    def member_names(self) -> tuple[list[str], list[str]]:
        """(the members at the end, the members lost), as this site names them."""
        return [self.name(m) for m in self.members], [self.name(m) for m in self.lost]


eval_counts = evalcounts.site_counts       # one site's additive evaluation (fedavg.py uses it too)
eval_metrics = evalcounts.metrics         # the federation's AUC, log-loss and accuracy from the sums


def to_sklearn(doc: Mapping[str, Any]) -> Any:
    """A fitted scikit-learn LogisticRegression from `logistic.sklearn_export`'s dictionary."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression()
    model.coef_ = np.asarray(doc["coef_"], dtype=np.float64)
    model.intercept_ = np.asarray(doc["intercept_"], dtype=np.float64)
    model.classes_ = np.asarray(doc["classes_"])
    model.n_features_in_ = int(doc["n_features_in_"])
    return model


# ---------------------------------------------------------------------------------------------
# The stored model: validated arrays (numpy .npz, loaded without pickle)

def save_model(path: Any, model: Mapping[str, Any]) -> None:
    from fedpeer.base.store import atomic_write

    buf = io.BytesIO()
    np.savez(buf, version=np.array([MODEL_VERSION]), coef=np.asarray(model["coef"], dtype=np.float64),
             intercept=np.asarray(model["intercept"], dtype=np.float64),
             features=np.array(json.dumps(list(model["features"]))),
             classes=np.array(json.dumps(list(model["classes"]))))
    atomic_write(path, buf.getvalue())


def load_model(path: Any) -> dict:
    """The stored model, checked: JobError naming the file for anything but what save_model wrote."""
    def bad(why: str) -> JobError:
        return JobError(f"{path}: not a logreg model fedpeer stored ({why})")

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("version", "coef", "intercept", "features", "classes")}
    except (OSError, ValueError, KeyError) as exc:
        raise bad(str(exc)[:200]) from None
    version = arrays["version"]
    if version.shape != (1,) or version.dtype.kind not in "iu" or version[0] != MODEL_VERSION:
        raise bad("unknown version")
    try:
        features, classes = json.loads(str(arrays["features"])), json.loads(str(arrays["classes"]))
    except (ValueError, TypeError):
        raise bad("feature or class names are not JSON") from None
    if not (isinstance(features, list) and all(isinstance(f, str) for f in features) and 0 < len(features)
            <= FEATURES_MAX and isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise bad("feature or class names")
    coef, intercept = arrays["coef"], arrays["intercept"]
    groups = len(classes) if len(classes) > 2 else 1
    if coef.dtype != np.float64 or coef.shape != (groups, len(features)) or intercept.dtype != np.float64 \
            or intercept.shape != (groups,) or not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
        raise bad(f"coefficients of shape {coef.shape} / {intercept.shape}")
    return {"coef": coef, "intercept": intercept, "features": tuple(features), "classes": classes}


def predict(model: Mapping[str, Any], X: np.ndarray) -> np.ndarray:
    return linear.predict_proba(model["coef"], model["intercept"], X)


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                  offload: Callable[..., Any] | None = None) -> dict:
    """The kind's run(); `offload` runs the local terms (asyncio.to_thread in the daemon; inline in
    simulations under virtual time)."""
    member = Member(ch, params, ctx, offload)
    return await member.run()


def _run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> Any:
    return run_job(ch, params, ctx)


# [policy.logreg]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "iterations_max": Limit("max_iter", 10_000, "accepted solver steps, one secure sum each at least (max_iter)"),
    "rounds_max": Limit("rounds", 10_000, "mode fedavg: communication rounds, one secure sum each (rounds)"),
    "local_epochs_max": Limit("local_epochs", 1000,
                              "mode fedavg: passes over the site's rows per round (local_epochs)"),
    "dp_iterations_max": Limit("dp_iterations", 1000,
                               "with dp_epsilon: gradient steps, one noised secure sum each (dp_iterations)"),
}


def export_file(path: Path, result: Mapping[str, Any]) -> dict:
    """`fedpeer export`: the stored model as scikit-learn LogisticRegression's attributes."""
    model = load_model(path)
    return linear.sklearn_export(model["coef"], model["intercept"], model["classes"], list(model["features"]))


KIND = JobKind(name="logreg", help="federated L2 logistic regression: exact Newton / L-BFGS on secure-summed "
               "gradients; the coefficients of the pooled rows",
               params=PARAMS, run=_run, needs_data=True, binary_label=False, save_model=save_model,
               model_file="model.npz", member_failure_aborts=False,
               limits=LIMITS, describe=functools.partial(text.describe, "logreg"), site_table=text.site_table,
               predict=functools.partial(text.predict_file, load_model, predict), export=export_file,
               history=text.history)
