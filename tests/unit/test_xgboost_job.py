"""Pure parts of the xgboost job (fedpeer/kinds/xgboost/kind.py): labels, base score, evaluation counts,
history adoption, parameters; the protocol itself runs in tests/sim/test_xgboost_sim.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import JobContext
from fedpeer.kinds.xgboost import kind as xj
from fedpeer.ml.xgb import boosting
from fedpeer.wire import frame as wire


def ds(labels: list[str], positive: str | None = None) -> Dataset:
    X = np.arange(len(labels) * 2, dtype=np.float64).reshape(-1, 2)
    y = None if positive is None else np.array([v == positive for v in labels], dtype=np.int8)
    return Dataset(("a", "b"), X, y, np.array(labels), 0, schema_fingerprint(("a", "b"), [FEATURE_TYPE_FLOAT] * 2))


def params(**over) -> dict:
    return xj.KIND.check_params(over)


def test_binary_labels_need_positive_and_two_values():
    assert xj.site_labels(ds(["m", "b", "m"], "m"), params()).tolist() == [1, 0, 1]
    assert xj.site_labels(ds(["b", "b"], "m"), params()).tolist() == [0, 0]      # one class at a site is fine
    with pytest.raises(DataError, match="positive"):
        xj.site_labels(ds(["m", "b"]), params())
    with pytest.raises(DataError, match="not two"):
        xj.site_labels(ds(["m", "b", "x"], "m"), params())


def test_multiclass_labels_follow_the_job_class_order():
    p = params(objective="multi:softprob", classes="low, mid,high")
    assert xj.class_names(p) == ["low", "mid", "high"]
    assert xj.site_labels(ds(["high", "low", "high"]), p).tolist() == [2, 0, 2]
    with pytest.raises(DataError, match="not among"):
        xj.site_labels(ds(["low", "top"]), p)
    for bad in ("", "a", "a,a"):
        with pytest.raises(JobError, match="classes"):
            xj.class_names(params(objective="multi:softprob", classes=bad))


def test_base_score_from_summed_label_statistics():
    y1, y2 = np.array([1, 0, 0, 1]), np.array([1, 1, 0])
    p = params()
    base, rows = xj.base_from_total(xj.label_vector(y1, p, 2) + xj.label_vector(y2, p, 2), p)
    assert rows == 7 and base == pytest.approx(4 / 7, rel=1e-6)
    p = params(objective="multi:softprob", classes="a,b,c")
    base, rows = xj.base_from_total(xj.label_vector(np.array([0, 2, 2]), p, 2)
                                    + xj.label_vector(np.array([1]), p, 2), p)
    assert rows == 4 and len(base) == 3 and np.argmax(base) == 2
    p = params(objective="reg:squarederror")
    y1, y2 = np.array([1.5, -2.0, 10.25]), np.array([3.0])
    base, rows = xj.base_from_total(xj.label_vector(y1, p, 2) + xj.label_vector(y2, p, 2), p)
    assert rows == 4 and base == pytest.approx(12.75 / 4, rel=1e-6)      # the label mean, as a margin


def test_evaluation_vectors_add_up_to_the_pooled_metrics():
    from sklearn.metrics import log_loss, roc_auc_score
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    p = np.clip(0.3 * y + 0.7 * rng.random(300), 0, 1)
    pa = params(train_loss=False)          # the test part alone: what members without xgb-train-loss-1 sum
    m = xj.eval_metrics(sum(xj.eval_vector(y[i::3], p[i::3], pa, 3) for i in range(3)), pa)
    assert m["test_rows"] == 300 and m["accuracy"] == pytest.approx(((p > 0.5) == y).mean(), abs=1e-6)
    assert m["logloss"] == pytest.approx(log_loss(y, p), abs=1e-6)
    assert m["auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)      # ties inside a bin count 1/2
    yr, pred = rng.normal(5, 3, 300), rng.normal(5, 3, 300)
    pr = params(objective="reg:squarederror", train_loss=False)
    m = xj.eval_metrics(sum(xj.eval_vector(yr[i::3], pred[i::3], pr, 3) for i in range(3)), pr)
    assert m["test_rows"] == 300 and set(m) == {"rmse", "mae", "test_rows"}
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((pred - yr) ** 2)), abs=1e-6)
    assert m["mae"] == pytest.approx(np.mean(np.abs(pred - yr)), abs=1e-6)


def test_the_training_loss_rides_the_evaluation_sum_and_is_checked_in_exact_integers():
    """train_loss: each site's training rows and summed log-loss (regression: Σe², Σ|e|) in the
    evaluation's own sum; the total gives the pooled training loss, and a total no honest sites
    give (rows beyond the federation's, a loss beyond -log(1e-15) a row) is refused by name."""
    from sklearn.metrics import log_loss
    from fedpeer.kinds.xgboost import target
    rng = np.random.default_rng(1)
    y, p = rng.integers(0, 2, 90), rng.random(90)          # test rows
    yt, pt = rng.integers(0, 2, 300), rng.random(300)      # training rows
    pa = params()
    assert pa["train_loss"] is True
    parts = [xj.eval_vector(y[i::3], p[i::3], pa, 3, target.train_sums(yt[i::3], pt[i::3], pa)) for i in range(3)]
    total = sum(parts)
    target.check_eval(total, pa, 300)
    m = xj.eval_metrics(total, pa)
    assert m["train_rows"] == 300 and m["test_rows"] == 90
    assert m["train_logloss"] == pytest.approx(log_loss(yt, pt), abs=1e-6)
    assert m["logloss"] == pytest.approx(log_loss(y, p), abs=1e-6)
    with pytest.raises(ValueError, match="federation's training rows"):
        target.check_eval(total, pa, 299)           # more training rows than the label sum counted
    with pytest.raises(ValueError, match="federation's training rows"):
        target.check_eval(total, pa)                # no bound known: nothing to check it against
    from fedpeer.ml.moments import FIXED
    loss_at = 2 * pa["eval_bins"] + 2 + 1 + FIXED.limbs    # test counts, training rows, the test loss's limbs
    liar = parts[0].copy()
    liar[loss_at] += np.uint64(40 * 300 * 2**32)    # its lowest limb: 40 nats a row more than a clipped log loses
    with pytest.raises(ValueError, match="training log-loss"):
        target.check_eval(liar + parts[1] + parts[2], pa, 300)
    with pytest.raises(ValueError, match="length"):
        target.check_eval(total, params(train_loss=False), 300)   # a layout the job did not choose
    assert target.curve_metrics(total, pa)["train_logloss"] == m["train_logloss"]   # the last point's too
    pr = params(objective="reg:squarederror")
    yr, pred = rng.normal(5, 3, 200), rng.normal(5, 3, 200)
    total = sum(xj.eval_vector(yr[i::2], pred[i::2], pr, 2, target.train_sums(yr[i::2], pred[i::2] + 1, pr))
                for i in range(2))
    target.check_eval(total, pr, 200)
    m = xj.eval_metrics(total, pr)
    assert m["train_rows"] == 200 and m["train_rmse"] == pytest.approx(np.sqrt(np.mean((pred + 1 - yr) ** 2)),
                                                                      abs=1e-6)
    with pytest.raises(ValueError, match="training part"):
        xj.eval_vector(yr, pred, pr, 2)             # a site that forgot its training part fails alone


def test_regression_labels_are_the_label_column_numbers():
    p = params(objective="reg:squarederror")
    assert xj.site_labels(ds(["1.5", "-2", "1e3"]), p).tolist() == [1.5, -2.0, 1000.0]
    with pytest.raises(DataError, match="numeric label: data row 2 has 'abc'"):
        xj.site_labels(ds(["1", "abc"]), p)
    with pytest.raises(DataError, match="finite"):
        xj.site_labels(ds(["1", "inf"]), p)


def test_directives_and_replies_round_trip_the_wire_schema():
    d = xj._directive(7, "commit", 3, prev_sha="a" * 64, sha="b" * 64, trees=[b"{}", b"[]"],
                      participants=[b"k" * 32])
    from fedpeer.kinds.catalog import job_kinds
    job_kinds()                                   # the catalogue registers the kinds' messages
    spec = wire._BY_CLASS[xj.Directive]
    body = spec.to_body(d)
    assert spec.from_body(spec.schema(body, "body")) == d
    with pytest.raises(wire.RemoteProtocolError):
        spec.schema({**body, "op": "overwrite"}, "body")
    with pytest.raises(wire.RemoteProtocolError):
        spec.schema({**body, "gain_share": 2.0}, "body")


def test_history_from_a_peer_is_checked_and_only_covers_adopted_rounds():
    site = xj.Site(ch=None, params=params(), ctx=JobContext("a", {}, 1000), tools=xj.Tools())
    site.commit = (2, 3, "s3")
    site.history = [{"round": 1, "model_sha256": "old"}, {"round": 3, "model_sha256": "s3", "mine": True}]
    raw = json.dumps([{"round": 1, "model_sha256": "s1"}, {"round": 2, "model_sha256": "s2"},
                      {"round": 9, "model_sha256": "future"}, {"round": "2"}, "junk",
                      {"round": 2, "pad": "x" * (xj.HISTORY_ENTRY_BYTES_MAX + 1)}]).encode()
    site.take_history(raw)
    assert [(h["round"], h["model_sha256"]) for h in site.history] == [(1, "s1"), (2, "s2"), (3, "s3")]
    site.take_history(b"\xff not json")
    assert [h["round"] for h in site.history] == [3]


def test_the_leader_refuses_trees_it_cannot_parse():
    """validate_trees is the leader's gate for a member's trees: garbage is a TreesError."""
    with pytest.raises(boosting.TreesError):
        boosting.validate_trees(b'{"format": "x"}', num_feature=2, num_class=0, num_local_round=1, max_depth=3,
                                max_nodes=15, leaf_abs_max=10.0)


def stored_job(tmp_path):
    """A finished xgboost job as the registry stores it: job.json (with the model's SHA-256) and
    model.json; returns (config-like object, job id, model path, CSV of rows to score)."""
    from types import SimpleNamespace

    from fedpeer.base.store import write_json

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(np.int64)
    doc = boosting.train_local_round(None, X, y, {"objective": "binary:logistic", "max_depth": 3, "nthread": 1,
                                                  "base_score": 0.5}, 2, 0.3, seed=1)
    model = boosting.append_round(None, [doc], 0.5, 3, 0, "binary:logistic")
    job = tmp_path / "jobs" / "j1"
    job.mkdir(parents=True)
    xj.save_model(job / "model.json", model)
    write_json(job / "job.json", {"kind": "xgboost", "state": "done", "result": {
        "model_file": str(job / "model.json"), "model_sha256": boosting.model_sha256(model),
        "features": ["a", "b", "c"], "classes": []}})
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b,c\n" + "\n".join(",".join(f"{v:.3f}" for v in row) for row in X) + "\n")
    return SimpleNamespace(node=SimpleNamespace(state_dir=tmp_path)), "j1", job / "model.json", csv


def test_predict_refuses_a_model_file_modified_after_it_was_stored(tmp_path):
    """issue 10: one split feature changed, still canonical JSON (model_info accepts it), yet the job
    record holds the original SHA-256: predict must refuse it, naming the file."""
    from fedpeer.app.predict import predict_csv

    config, job_id, path, csv = stored_job(tmp_path)
    assert len(predict_csv(config, job_id, csv)) == 60              # the stored model scores
    raw = json.loads(path.read_bytes())
    tree = raw["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["split_indices"][0] = (tree["split_indices"][0] + 1) % 3
    tampered = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    assert boosting.model_info(tampered).n_trees == 2                # still a well-formed canonical model
    path.write_bytes(tampered)
    with pytest.raises(JobError, match="model.json: the model file was modified or corrupted") as info:
        predict_csv(config, job_id, csv)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    path.write_bytes(b"")                                            # a truncated file: refused the same way
    with pytest.raises(JobError, match="modified or corrupted"):
        xj.load_model(path, boosting.model_sha256(tampered))
