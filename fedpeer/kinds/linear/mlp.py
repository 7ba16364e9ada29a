"""`mlp`: a small neural network (scikit-learn `MLPClassifier` weights) trained by FedAvg over
secure sums, with optional two-level (group) aggregation (the loop is
fedpeer/kinds/linear/fedavg.py, the network fedpeer/ml/linear/mlp.py).

Features are standardised with the federation's mean and standard deviation first (the same two
secure sums as `logreg`); every member starts from the same seeded weights; each round every
site trains its own MLPClassifier (plain SGD) `local_epochs` passes from the current weights and
the row-weighted average goes through the secure sum (a member lost mid-job: the rounds go on over
the survivors, fedpeer/kinds/linear/fedavg.py says precisely how; `lost` names it). The model —
the weights, the mean and the scale — is stored as validated arrays (.npz, loaded without
pickle); `fedpeer predict` scores with it and `fedpeer export` writes the weights as JSON arrays
(coefs_ / intercepts_ as MLPClassifier holds them, for standardised inputs).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param, site_seed
from fedpeer.jobs.params import EPOCH_VIEWS_PARAM, SECURE_SUM_COMPACT, SECURE_SUM_LARGE
from fedpeer.kinds.linear import text
from fedpeer.kinds.linear.fedavg import FEDAVG_PARAMS, Rounds, check_groups, current_groups, group_view
from fedpeer.kinds.linear.logreg import HELD_OUT, Member
from fedpeer.ml import evaluation
from fedpeer.ml.linear import mlp

MODEL_VERSION = 1
LAYERS_MAX = 10

PARAMS = {
    "hidden_layer_sizes": Param(str, "16", "units of each hidden layer (ReLU), comma-separated, e.g. 32,16"),
    "alpha": Param(float, 1e-4, "L2 penalty (MLPClassifier alpha)", low=0.0, high=1e3),
    "classes": Param(str, "", "the label values, comma-separated, in class order: 3 or more -> softmax output; "
                     "2 -> binary, the second one positive; empty -> binary with [data] positive"),
    "eval_bins": Param(int, 1000, "score histogram bins for the federated AUC", low=10, high=100_000),
    "secure_sum": SECURE_SUM_LARGE,
    "epoch_views": EPOCH_VIEWS_PARAM,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    "test_fraction": HELD_OUT,
    **FEDAVG_PARAMS,
}


class MlpMember(Member):
    KIND_NAME = "mlp"

    async def fit(self) -> dict:
        p = self.params
        try:
            hidden = mlp.parse_hidden(p["hidden_layer_sizes"])
        except ValueError as exc:
            raise JobError(f"mlp: {exc}") from None
        view = group_view(current_groups(self), self.members)
        fed_counts, mean, scale, extra = await self.scaling(view)
        await check_groups(self, extra, view)
        Z = (self.X - mean) / scale
        evaluated = Z if self.held is None else (self.held[0] - mean) / scale   # held-out part (test_fraction)
        sizes = mlp.layer_sizes(self.X.shape[1], hidden, self.groups)
        trainer = mlp.LocalTrainer(Z, self.y, sizes, self.groups, p["learning_rate"], p["batch_size"], p["alpha"],
                                   site_seed(p["seed"], self.ch.me))

        def proba(w: np.ndarray) -> np.ndarray:
            return mlp.predict_proba(*mlp.unflatten(w, sizes), evaluated)

        rounds = Rounds(self, lambda w, r: trainer.train(w, p["local_epochs"]), proba,
                        mlp.initial_weights(sizes, p["seed"]), int(fed_counts.sum()))
        w = await rounds.run(len(self.y))
        coefs, intercepts = mlp.unflatten(w, sizes)
        last = rounds.history[-1]
        out: dict[str, Any] = {
            "mode": "fedavg", "status": "rounds done", "rounds": p["rounds"], "layer_sizes": sizes,
            "features": list(self.ctx.data.features),
            "classes": self.names, "coefs": [c.tolist() for c in coefs], "intercepts": [b.tolist() for b in intercepts],
            "mean": mean.tolist(), "scale": scale.tolist(), "rows": int(fed_counts.sum()),
            "test_rows": self.fed_held, "test_fraction": p["test_fraction"],
            "classes_absent_here": [(self.names or ["negative", "positive"])[k]
                                    for k, c in enumerate(np.bincount(self.y, minlength=len(fed_counts))) if c == 0],
            "history": rounds.history, "fedavg": rounds.summary(), "secure_sums": self.sums,
            "members": self.member_names()[0], "lost": self.member_names()[1],
            "federated_eval": {k: last[k] for k in ("auc", "logloss", "accuracy", "rows")} | {
                "on": self.evaluated_on},
            "auc": last["auc"], "auc_source": f"federated, on {self.evaluated_on}",
        }
        if self.test is not None:
            test_auc = evaluation.local_auc(self.test[1],
                                            mlp.predict_proba(coefs, intercepts, (self.test[0] - mean) / scale))
            out["test_csv"] = {"auc": test_auc, "rows": int(len(self.test[1]))}
            out["auc"], out["auc_source"] = test_auc, "[data] test_csv"
        out["_model"] = {"coefs": coefs, "intercepts": intercepts, "mean": mean, "scale": scale,
                         "features": list(self.ctx.data.features), "classes": self.names}
        return out


def save_model(path: Any, model: Mapping[str, Any]) -> None:
    from fedpeer.base.store import atomic_write

    arrays: dict[str, np.ndarray] = {"version": np.array([MODEL_VERSION]), "layers": np.array([len(model["coefs"])]),
                                     "mean": np.asarray(model["mean"], dtype=np.float64),
                                     "scale": np.asarray(model["scale"], dtype=np.float64),
                                     "features": np.array(json.dumps(list(model["features"]))),
                                     "classes": np.array(json.dumps(list(model["classes"])))}
    for i, (c, b) in enumerate(zip(model["coefs"], model["intercepts"])):
        arrays[f"coef_{i}"], arrays[f"intercept_{i}"] = np.asarray(c, np.float64), np.asarray(b, np.float64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue())


def load_model(path: Any) -> dict:
    """The stored model, checked (shapes chain, values finite); JobError naming the file otherwise."""
    def bad(why: str) -> JobError:
        return JobError(f"{path}: not an mlp model fedpeer stored ({why})")

    try:
        with np.load(path, allow_pickle=False) as z:
            head = {k: z[k] for k in ("version", "layers", "mean", "scale", "features", "classes")}
            layers = head["layers"]
            if layers.shape != (1,) or layers.dtype.kind not in "iu" or not 1 <= int(layers[0]) <= LAYERS_MAX:
                raise bad("layer count")
            coefs = [z[f"coef_{i}"] for i in range(int(layers[0]))]
            intercepts = [z[f"intercept_{i}"] for i in range(int(layers[0]))]
    except (OSError, ValueError, KeyError) as exc:
        raise bad(str(exc)[:200]) from None
    if head["version"].shape != (1,) or head["version"].dtype.kind not in "iu" or head["version"][0] != MODEL_VERSION:
        raise bad("unknown version")
    try:
        features, classes = json.loads(str(head["features"])), json.loads(str(head["classes"]))
    except (ValueError, TypeError):
        raise bad("feature or class names are not JSON") from None
    if not (isinstance(features, list) and features and all(isinstance(f, str) for f in features)
            and isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise bad("feature or class names")
    d, out = len(features), len(classes) if len(classes) > 2 else 1
    width = d
    for c, b in zip(coefs, intercepts):
        if c.dtype != np.float64 or c.ndim != 2 or c.shape[0] != width or b.dtype != np.float64 \
                or b.shape != (c.shape[1],) or not (np.isfinite(c).all() and np.isfinite(b).all()):
            raise bad("weights whose shapes do not chain, or are not finite")
        width = c.shape[1]
    for name in ("mean", "scale"):
        v = head[name]
        if v.dtype != np.float64 or v.shape != (d,) or not np.isfinite(v).all() or (name == "scale" and (v <= 0).any()):
            raise bad(name)
    if width != out:
        raise bad(f"{width} outputs for {len(classes)} classes")
    return {"coefs": coefs, "intercepts": intercepts, "mean": head["mean"], "scale": head["scale"],
            "features": tuple(features), "classes": classes}


def predict(model: Mapping[str, Any], X: np.ndarray) -> np.ndarray:
    return mlp.predict_proba(model["coefs"], model["intercepts"], (X - model["mean"]) / model["scale"])


def export(model: Mapping[str, Any]) -> dict:
    """The weights as JSON arrays, in MLPClassifier's layout, with the standardisation they expect."""
    return {"coefs_": [c.tolist() for c in model["coefs"]], "intercepts_": [b.tolist() for b in model["intercepts"]],
            "classes_": model["classes"] or [0, 1], "activation": "relu",
            "out_activation_": "softmax" if len(model["classes"]) > 2 else "logistic",
            "feature_names_in_": list(model["features"]), "mean": model["mean"].tolist(),
            "scale": model["scale"].tolist(),
            "input": "(x - mean) / scale, then the layers: hidden ReLU, then out_activation_"}


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext,
                  offload: Callable[..., Any] | None = None) -> dict:
    return await MlpMember(ch, params, ctx, offload).run()


def _run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> Any:
    return run_job(ch, params, ctx)


# [policy.mlp]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "rounds_max": Limit("rounds", 10_000, "communication rounds, one secure sum each (rounds)"),
    "local_epochs_max": Limit("local_epochs", 1000, "passes over the site's rows per round (local_epochs)"),
}


def export_file(path: Path, result: Mapping[str, Any]) -> dict:
    """`fedpeer export`: the stored weights in MLPClassifier's layout."""
    return export(load_model(path))


KIND = JobKind(name="mlp", help="federated neural network (MLPClassifier weights) by FedAvg over secure sums, "
               "optionally with two-level group aggregation", params=PARAMS, run=_run, needs_data=True,
               binary_label=False, save_model=save_model, model_file="model.npz", member_failure_aborts=False,
               limits=LIMITS, describe=functools.partial(text.describe, "mlp"), site_table=text.site_table,
               predict=functools.partial(text.predict_file, load_model, predict), export=export_file,
               history=text.history)

