"""`xgboost`: federated XGBoost — the job kind, its parameters, its stored model. Two modes:
"histogram" (exact, `xgbhist.py` on `fedpeer.ml.xgb.histrun`) and "bagging" (tree / tree+, run in
rounds by the federation's elected leader: the protocol is in `xgbsite.py`, its leader's side in
`xgblead.py`, its messages in `xgbmsg.py`)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.base.store import atomic_write
from fedpeer.errors import JobError
from fedpeer.jobs.kind import Finished, JobContext, JobKind, Limit, Param, checked_total
from fedpeer.jobs.params import (
    DP_TREE_PARAMS,
    EPOCH_VIEWS_PARAM,
    REJOIN_PARAM,
    SECURE_SUM_COMPACT,
    SECURE_SUM_LARGE,
    seed,
    test_fraction,
)
from fedpeer.kinds.scoring import binary_rows, class_rows
from fedpeer.kinds.xgboost import text
from fedpeer.kinds.xgboost.hist_dp import refusal as dp_refusal
from fedpeer.kinds.xgboost.messages import (
    DIRECTIVE_TAG,
    HISTORY_BYTES_MAX,
    HISTORY_ENTRY_BYTES_MAX,
    HISTORY_FILE,
    MESSAGES,
    MODEL_BYTES_MAX,
    PARK_MS,
    POLL_MS,
    SYNC_SILENCE_MS,
    SYNC_TAG,
    Directive,
    Reply,
    SyncAsk,
    Tools,
    _Died,
    _directive,
    _reply_tag,
    train_params,
)
from fedpeer.kinds.xgboost.site import Site, score_result
from fedpeer.kinds.xgboost.target import (
    base_from_total,
    check_labels,
    class_names,
    eval_metrics,
    eval_vector,
    label_vector,
    prepare,
    site_labels,
)
from fedpeer.ml.xgb import boosting
from fedpeer.protocols.securesum.api import secure_sum

__all__ = ["DIRECTIVE_TAG", "HISTORY_ENTRY_BYTES_MAX", "KIND", "PARAMS", "PARK_MS", "POLL_MS", "SYNC_SILENCE_MS",
           "SYNC_TAG", "Directive", "Reply", "Site", "SyncAsk", "Tools", "_Died", "_directive", "_reply_tag",
           "base_from_total", "class_names", "eval_metrics", "eval_vector", "label_vector", "load_model",
           "predict", "prepare", "rejoin_job", "run_job", "save_model", "score_result", "serve_done", "site_labels",
           "train_params"]

log = logging.getLogger("fedpeer.jobs.xgboost")

PARAMS = {
    "mode": Param(str, "histogram", "histogram (default): exact federated XGBoost, every tree the one xgboost "
                  "hist grows on the pooled rows, from secure sums of gradient histograms (one tree per round and "
                  "class; a site sends up to 24 x features x (max_bin + 1) x "
                  "2^(max_depth - 1) bytes per tree, the sum's initiator about members times that) | bagging: "
                  "each site grows trees on its own rows, the elected leader stacks them (tree / tree+): fewer, "
                  "smaller messages, an approximation of the pooled model",
                  choices=("histogram", "bagging")),
    "rounds": Param(int, 20, "communication rounds", low=1, high=10_000),
    "num_local_round": Param(int, 1, "trees each site trains per round (and class): 1 = tree, >1 = tree+",
                             low=1, high=100),
    "eta": Param(float, 0.3, "learning rate", low=1e-6, high=1.0),
    "normalize": Param(str, "none", "bagging mode's learning rate per site: none (default; every site's trees "
                       "step eta, as Flower's FedXgbBagging) | samples (eta x site rows / all rows: a round's trees "
                       "add up to one step, so R rounds are one R-step model) | gain (eta x the site's share of the "
                       "last round's split gain)",
                       choices=("none", "samples", "gain")),
    "objective": Param(str, "binary:logistic", "binary:logistic, multi:softprob (with classes) or reg:squarederror "
                       "(a numeric label; federated RMSE and MAE instead of AUC)", choices=boosting.MODEL_OBJECTIVES),
    "classes": Param(str, "", "multi:softprob: the label values, comma-separated, in class order"),
    "max_depth": Param(int, 6, "maximum tree depth", low=1, high=16),
    "min_child_weight": Param(float, 1.0, "minimum hessian sum in a child", low=0.0, high=1e9),
    "reg_lambda": Param(float, 1.0, "L2 regularisation of leaf weights (xgboost lambda)", low=0.0, high=1e9),
    "subsample": Param(float, 1.0, "rows sampled per tree (histogram mode: each site draws its own rows from "
                       "the job seed and its key)", low=0.01, high=1.0),
    "colsample_bytree": Param(float, 1.0, "columns sampled per tree (histogram mode: the same columns at every "
                              "site, from the job seed)", low=0.01, high=1.0),
    "max_delta_step": Param(float, 0.0, "clip leaf weights to this (0: off)", low=0.0, high=1e6),
    "grad_abs_max": Param(float, 0.0, "histogram mode: the declared bound on a row's |gradient| (0: the objective's "
                          "own: 1 for classification, 1000 for reg:squarederror, i.e. |prediction - label|); a site "
                          "beyond it ends the job naming the bound; larger bounds cost gradient precision",
                          low=0.0, high=1e12),
    "gamma": Param(float, 0.0, "histogram mode: minimum loss reduction of a split (xgboost gamma)", low=0.0, high=1e9),
    "min_leaf_rows": Param(int, 2, "histogram mode: no split leaves fewer rows than this in a child, federation-wide",
                           low=1, high=2**40),
    "tree_method": Param(str, "hist", "xgboost tree method", choices=("hist", "approx", "exact")),
    "max_bin": Param(int, 256, "histogram bins per feature (hist, approx)", low=2, high=65_536),
    "nthread": Param(int, 0, "xgboost threads per site (0: all cores)", low=0, high=1024),
    "leaf_abs_max": Param(float, 10.0, "bagging mode: the leader refuses trees with a larger |leaf value| (margin "
                          "units, learning rate applied; reg:squarederror: label units)", low=1e-6, high=1e9),
    "test_fraction": test_fraction(0.2, 0.0, "share of each site's rows kept out of training for the per-round "
                                   "evaluation (0: train on every row; the rounds are then evaluated on the training "
                                   "rows)"),
    "eval_bins": Param(int, 1000, "score histogram bins of the final model's federated AUC (exact up to ties "
                       "inside a bin); an evaluation secure-sums 2 x bins x classes + 5 numbers per site, ~16 KB at "
                       "1,000 bins (binary), sent once per site and by the sum's initiator once more to every member",
                       low=10, high=100_000),
    "eval_round_bins": Param(int, 100, "score histogram bins of the rounds before the last (at most "
                             "eval_bins). What the default costs (binary): 205 numbers (~1.6 KB) per site and "
                             "round; measured on 5 daemons (breast cancer, 30 rounds) ~19 KB per evaluated round "
                             "over the whole federation against ~148 KB at 1,000 bins: a job's bytes 1.2 MB "
                             "instead of 5.0 MB (evaluation is then about half of them, not 86 in 100). AUC of 100"
                             " bins against the exact AUC, measured: median error <= 0.005, worst 0.056 (the first"
                             " rounds of a set with 3 in 100 rows positive, scores bunched in few bins); the last "
                             "round always uses eval_bins",
                             low=10, high=100_000),
    "eval_every": Param(int, 5, "evaluate the model every this many rounds, for the history and its curve (the "
                        "last round always; 0: the last round only); each evaluation is one small secure sum",
                        low=0, high=10_000),
    "train_loss": Param(bool, True, "the training loss beside the test metrics (history, curves, job show): every "
                        "evaluation's secure sum also carries each site's training rows and summed log-loss on them "
                        "(regression: squared and absolute errors, for RMSE), 4 (7) uint64 entries more a site, both "
                        "modes; a job with a member whose build lacks it runs without (false), never fails",
                        capability="xgb-train-loss-1", before=False, optional=True),
    "member_timeout_ms": Param(int, 600_000, "the leader waits this long for a site's trees", low=1_000,
                               high=86_400_000),
    "seed": seed("seed of the splits and of xgboost's sampling"),
    "secure_sum": SECURE_SUM_LARGE,   # histogram levels: the all-reduce; small sums (bagging's) take the ring
    "epoch_views": EPOCH_VIEWS_PARAM,  # histogram mode's survivors of a lost member (hist.py)
    "secure_sum_compact": SECURE_SUM_COMPACT,
    "rejoin": REJOIN_PARAM,            # histogram mode: a restarted member comes back before a tree (hist.py)
    **DP_TREE_PARAMS,   # differential privacy, histogram mode (fedpeer/kinds/xgboost/hist_dp.py): off at dp_epsilon = 0
}


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, tools: Tools | None = None) -> dict:
    if params.get("dp_epsilon", 0.0) > 0:
        from fedpeer.kinds.xgboost.hist_dp import run_dp
        return await run_dp(ch, params, ctx, offload=tools.offload if tools is not None else None)
    if params.get("mode") == "histogram":
        from fedpeer.kinds.xgboost.hist import run_hist
        return await run_hist(ch, params, ctx, offload=tools.offload if tools is not None else None)
    site = Site(ch=ch, params=params, ctx=ctx, tools=tools or Tools())
    prepare(site)
    ch.progress("secure sum of label counts", 0, params["rounds"])
    out = await secure_sum(ch, "xgb/labels", label_vector(site.fit[1], params, len(ch.members)),
                           mode=params["secure_sum"], hop_timeout_ms=ctx.hop_timeout_ms,
                           compact=params.get("secure_sum_compact", False))
    if ch.me not in out.participants:
        raise JobError("this site was left out of the label-count sum")
    checked_total("xgb/labels", check_labels, out.total, params, len(out.participants))
    site.base, site.total_rows = base_from_total(out.total, params)
    site.adopt(0, 0, None)
    try:
        site.train_ahead(None)     # round 1 needs only the base score: its trees, while a leader takes over
        return await site.run()
    finally:
        await site.close()


def rejoin_refused(params: Mapping[str, Any]) -> str | None:
    """Why a job with these parameters does not take a restarted member back, or None."""
    if params.get("mode", "histogram") != "histogram":
        return "bagging mode does not take a restarted member back (histogram mode does)"
    if params.get("dp_epsilon", 0.0) > 0:
        return "a job with differential privacy does not take a restarted member back"
    if not params.get("epoch_views") or not params.get("rejoin"):
        return "the job runs without rejoins (rejoin or epoch_views false, or a member's release lacks them)"
    return None


async def rejoin_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, tools: Tools | None = None) -> dict:
    """A member restarted mid-job asks to come back (histogram mode; rejoin_refused says when not)."""
    refusal = rejoin_refused(params)
    if refusal is not None:
        raise JobError(refusal)
    from fedpeer.kinds.xgboost.hist import run_hist
    return await run_hist(ch, params, ctx, offload=tools.offload if tools is not None else None, rejoining=True)


def serve_done(finished: Finished, src: bytes, msg: Any) -> Directive | None:
    """This site's job is done and a member asks where the job is (SyncAsk, module docstring):
    if this site leads now, the job's end ("done") with the final model and history, read from
    what it stored, under its current term; else None (the member asks the leader it knows)."""
    term, leader = finished.leadership
    if not isinstance(msg, SyncAsk) or leader != finished.me or term <= 0:
        return None
    with open(finished.workdir / "xgb-commit.json", "rb") as f:
        commit = json.loads(f.read(64 * 1024))
    model_file = commit.get("model_file")
    if not model_file or not isinstance(commit.get("round"), int) or not isinstance(commit.get("term"), int):
        return None
    with open(finished.workdir / str(model_file), "rb") as f:
        model = f.read(MODEL_BYTES_MAX + 1)
    if len(model) > MODEL_BYTES_MAX or boosting.model_sha256(model) != commit.get("model_sha256"):
        return None      # changed since it was stored: offer nothing rather than something else
    try:
        with open(finished.workdir / HISTORY_FILE, "rb") as f:
            history = f.read(HISTORY_BYTES_MAX + 1)
    except FileNotFoundError:
        history = b""
    history = history if len(history) <= HISTORY_BYTES_MAX else b""
    return _directive(term, "done", commit["round"], sha=commit["model_sha256"], model=model,
                      commit_term=commit["term"], history=history)


def save_model(path: Any, model: bytes) -> None:
    """The global model: a normal XGBoost JSON model file (`xgboost.Booster().load_model(path)`)."""
    atomic_write(path, model)


def load_model(path: Any, expect_sha256: str) -> bytes:
    """A stored model, refused unless its bytes hash to `expect_sha256` (the SHA-256 the job or
    commit record holds): a file modified or corrupted after it was stored is never used, even
    when it is still a well-formed model. JobError in one line naming the file."""
    try:
        with open(path, "rb") as f:
            model = f.read(boosting.MODEL_BYTES_MAX + 1)
    except OSError as exc:
        raise JobError(f"{path}: cannot read the stored model: {exc.strerror or exc}") from None
    sha = boosting.model_sha256(model)
    if sha != expect_sha256:
        raise JobError(f"{path}: the model file was modified or corrupted after it was stored (SHA-256 "
                       f"{sha[:16]}..., the job record says {str(expect_sha256)[:16]}...); "
                       "restore it from a backup or run the job again")
    boosting.model_info(model)      # canonical and well-formed, or TreesError
    return model


def predict(model: bytes, X: np.ndarray, nthread: int | None = None) -> np.ndarray:
    return boosting.predict_proba(model, X, nthread=nthread)


def predict_file(path: Path, result: Mapping[str, Any], rows: Callable[[Sequence[str]], np.ndarray]) -> list[dict]:
    """`fedpeer predict` with the stored model, checked against the record's model_sha256: the
    predicted value (regression), P(positive) and 0/1, or every class's P."""
    if not isinstance(result.get("model_sha256"), str):
        raise JobError(f"{path.parent / 'job.json'}: the job record holds no model_sha256 to check {path} against")
    model = load_model(path, result["model_sha256"])
    proba = predict(model, rows(tuple(result["features"])))
    classes = result.get("classes") or []
    if result.get("objective") == "reg:squarederror":
        return [{"row": i + 1, "prediction": float(v)} for i, v in enumerate(proba)]
    return binary_rows(proba) if not classes else class_rows(proba, classes)


def export_file(path: Path, result: Mapping[str, Any]) -> dict:
    """`fedpeer export`: the stored model, checked as `predict` checks it, as xgboost's own JSON
    model document: `xgboost.Booster(model_file=...)` loads it and predicts what `fedpeer
    predict` gives. It carries the columns in xgboost's own `feature_names` / `feature_types`
    fields, so xgboost checks a DataFrame's columns by name (and refuses data without names)."""
    if not isinstance(result.get("model_sha256"), str):
        raise JobError(f"{path.parent / 'job.json'}: the job record holds no model_sha256 to check {path} against")
    doc = json.loads(load_model(path, result["model_sha256"]))
    features = [str(f) for f in result.get("features") or []]
    if features:
        doc["learner"]["feature_names"] = features
        doc["learner"]["feature_types"] = ["float"] * len(features)
    return doc


def export_note(result: Mapping[str, Any]) -> str:
    features = list(result.get("features") or [])
    return (f"xgboost's own JSON model: load it with xgboost.Booster(model_file=FILE) (the file name ending "
            f".json); it names its {len(features)} columns (feature_names), and booster.predict("
            f"xgboost.DMatrix(df)) checks a DataFrame's columns by name: {', '.join(features)}")


# [policy.xgboost]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "rounds_max": Limit("rounds", 10_000, "communication rounds (rounds)"),
    "trees_per_round_max": Limit("num_local_round", 100, "trees each site trains per round (num_local_round)"),
    "depth_max": Limit("max_depth", 16, "tree depth (max_depth)"),
    "bins_max": Limit("max_bin", 65_536, "histogram bins per feature (max_bin)"),
}


KIND = JobKind(name="xgboost", help="federated XGBoost: tree bagging / tree+ in rounds run by the elected leader "
               "(--mode bagging), or exact histogram mode over secure sums (--mode histogram)",
               params=PARAMS, run=functools.partial(run_job, tools=None), needs_data=True, binary_label=False,
               save_model=save_model, model_file="model.json", member_failure_aborts=False,
               serve_done=serve_done, serve_done_kinds=(SyncAsk,),
               rejoin=functools.partial(rejoin_job, tools=None), rejoin_refused=rejoin_refused,
               messages=MESSAGES, limits=LIMITS, describe=text.describe, site_table=text.site_table,
               predict=predict_file, export=export_file, export_note=export_note, history=text.history,
               rounds_metric=True, led=lambda p: p.get("mode") == "bagging",
               dask_support='xgboost with mode = "histogram"', refused=dp_refusal,
               dask_refused=lambda p: "xgboost with dp_epsilon" if p.get("dp_epsilon", 0.0) > 0 else
               None if p.get("mode", "histogram") == "histogram" else f"xgboost with mode = {p.get('mode')!r}")
