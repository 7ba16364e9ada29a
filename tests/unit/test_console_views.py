"""What the console's page is given (fedpeer/app/console/views.py): proposals checked as `fedpeer
run` checks its command line, curves from a kind's own history or any per-round entries, the model
card's parameters and metrics, per-site rows, and JSON a browser can parse."""

from __future__ import annotations

import json

import pytest

from fedpeer.app.console import views
from fedpeer.errors import JobError
from fedpeer.kinds.catalog import job_kinds


def test_every_kind_of_the_catalogue_is_offered_with_its_parameters() -> None:
    doc = views.kinds_doc()
    assert [k["name"] for k in doc] == list(job_kinds())
    for kind in doc:
        declared = job_kinds()[kind["name"]].params
        assert [p["name"] for p in kind["params"]] == list(declared)
        assert all(p["type"] in ("int", "float", "str", "bool") for p in kind["params"])
    json.dumps(doc, allow_nan=False)


def test_a_proposal_is_typed_and_checked_before_any_daemon_is_asked() -> None:
    name = next(n for n, k in job_kinds().items() if {"k", "standardize", "tol"} <= set(k.params))
    kind, params, members = views.proposal({"kind": name, "params": {"k": "3", "standardize": "true", "tol": "1e-3"},
                                            "members": " a, b ,"})
    assert (kind, params, members) == (name, {"k": 3, "standardize": True, "tol": 0.001}, ["a", "b"])
    assert views.proposal({"kind": name, "params": {}, "members": ""})[2] is None
    for bad, said in [({"kind": "nope"}, "unknown job kind"), ({"kind": name, "params": {"k": "0"}}, "outside"),
                      ({"kind": name, "params": {"k": "three"}}, "expected int"),
                      ({"kind": name, "params": {"zzz": 1}}, "unknown parameter"),
                      ({"kind": name, "params": {"standardize": "maybe"}}, "expected bool"),
                      ({"kind": name, "members": 5}, "members"), ([1], "JSON object")]:
        with pytest.raises(JobError, match=said):
            views.proposal(bad)


def test_series_take_the_round_as_x_and_every_other_number_as_a_curve() -> None:
    entries = [{"round": 1, "auc": 0.7, "loss": 0.5, "note": "x", "ok": True}, {"round": 2, "auc": 0.8, "loss": 0.4},
               {"round": 3, "auc": None, "loss": float("nan")}]
    assert views.series(entries) == {"auc": [[1.0, 0.7], [2.0, 0.8]], "loss": [[1.0, 0.5], [2.0, 0.4]]}
    assert views.series([{"inertia": 9.0}, {"inertia": 4.0}]) == {"inertia": [[1.0, 9.0], [2.0, 4.0]]}
    assert views.series([]) == {} and views.series(["junk"]) == {}


def test_curves_come_from_the_kinds_history_else_from_the_records_entries() -> None:
    kind = next(k for k in job_kinds().values() if k.history is not None)
    drawn = {"m": [(1, 2.0), (2, 1.0)]}
    fake = type("Kind", (), {"history": staticmethod(lambda result: drawn)})()
    assert views.curves(fake, {"result": {"x": 1}}) == {"m": [[1.0, 2.0], [2.0, 1.0]]}
    running = {"result": None, "history": [{"round": 1, "loss": 3.0}, {"round": 2, "loss": 2.0}]}
    assert views.curves(kind, running) == {"loss": [[1.0, 3.0], [2.0, 2.0]]}, "a running job's entries, live"
    broken = type("Kind", (), {"history": staticmethod(lambda result: result["missing"])})()
    assert views.curves(broken, {"result": {"history": [{"a": 1.0}, {"a": 2.0}]}}) == {"a": [[1.0, 1.0], [2.0, 2.0]]}


def test_the_card_lists_changed_parameters_and_every_metric_with_its_rows() -> None:
    name, kind = next((n, k) for n, k in job_kinds().items() if "k" in k.params)
    default_k = kind.params["k"].default
    record = {"kind": name, "params": {"k": default_k + 1, "seed": kind.params["seed"].default},
              "members": [{"name": "a", "fingerprint": "f1"}], "data_fingerprint": "ab" * 32,
              "result": {"auc": 0.91, "auc_source": "[data] test_csv", "test_rows": 40, "rows": 400, "k": 2.0,
                         "federated_eval": {"logloss": 0.3, "accuracy": 0.8, "rows": 300, "on": "training rows"},
                         "iterations": 7, "_model": {"w": 1.5}, "model_sha256": "cd" * 32}}
    card = views.card(kind, record)
    assert card["params_changed"] == {"k": default_k + 1}
    assert card["members"] == ["a (f1)"] and card["data_fingerprint"] == "ab" * 32 and card["model_sha256"] == "cd" * 32
    assert card["metrics"] == [
        {"name": "auc", "value": 0.91, "rows": 40, "source": "[data] test_csv"},
        {"name": "federated_eval.logloss", "value": 0.3, "rows": 300, "source": "training rows"},
        {"name": "federated_eval.accuracy", "value": 0.8, "rows": 300, "source": "training rows"}]


def test_per_site_rows_read_each_sites_own_record_by_fingerprint() -> None:
    record = {"members": [{"name": "a", "fingerprint": "f1"}, {"name": "b", "fingerprint": "f2"},
                          {"name": "c", "fingerprint": "f3"}]}
    mine = {"state": "done", "rows": 10, "elapsed_s": 1.0, "error": None, "params": {}, "result": {"auc": 0.5}}
    rows = views.sites(record, [("f1", "a", mine, None), ("f2", "b", None, "its daemon does not answer")])
    assert [(r["name"], r["read"], r["state"], r["note"]) for r in rows] == [
        ("a", True, "done", None), ("b", False, None, "its daemon does not answer"),
        ("c", False, None, "its result stays at that site")]
    assert rows[0]["metrics"] == [{"name": "auc", "value": 0.5, "rows": None, "source": None}]


def test_answers_hold_no_number_a_browser_cannot_parse() -> None:
    doc = views.finite({"a": [1.0, float("inf"), {"b": float("nan")}], "c": (2, "x")})
    assert json.dumps(doc, allow_nan=False) == '{"a": [1.0, null, {"b": null}], "c": [2, "x"]}'


def test_charts_title_their_axes_with_units_and_rows_bound_metrics_and_draw_no_constants() -> None:
    """Issue 39: a reviewer reads what each axis is, on how many rows each point rests, bounded
    metrics on [0, 1]; `test_rows` and other constant counts are not curves."""
    drawn = {"auc": [[1.0, 0.98], [2.0, 0.985]], "logloss": [[1.0, 0.3], [2.0, 0.2]],
             "test_rows": [[1.0, 103.0], [2.0, 103.0]], "trees_added": [[1.0, 3.0], [2.0, 3.0]]}
    charts = views.charts(drawn, {"params": {"test_fraction": 0.2}, "result": None})
    assert [c["name"] for c in charts] == ["auc", "logloss"]
    auc, loss = charts
    assert auc["x_title"] == "round" and auc["y_title"] == "AUC · 103 held-out rows per point"
    assert auc["y_range"] == [0.0, 1.0] and loss["y_range"] is None
    assert loss["y_title"] == "log-loss (nats per row) · 103 held-out rows per point"
    done = views.charts({"inertia": [[1.0, 9.0], [2.0, 4.0]]}, {"params": {}, "result": {"rows": 500}})
    assert done == [{"name": "inertia", "points": [[1.0, 9.0], [2.0, 4.0]], "x_title": "round",
                     "y_title": "inertia (sum of squared distances)", "y_range": None}]


def test_the_card_names_the_mode_and_each_metric_once_without_base_score() -> None:
    name, kind = next((n, k) for n, k in job_kinds().items() if "mode" in k.params and "eval_round_bins" in k.params)
    record = {"kind": name, "params": {"mode": "bagging"}, "members": [],
              "result": {"mode": None, "auc": 0.98, "auc_source": "federated", "base_score": 0.37,
                         "federated_eval": {"auc": 0.98, "logloss": 0.1, "test_rows": 103, "rows": "test parts"}}}
    card = views.card(kind, record)
    assert card["mode"] == "bagging"
    assert [m["name"] for m in card["metrics"]] == ["auc", "federated_eval.logloss"]
    assert card["metrics"][1]["source"] == "test parts" and card["metrics"][1]["rows"] == 103   # where, on how many
    hist = views.card(kind, {**record, "result": {**record["result"], "mode": "histogram"}})
    assert hist["mode"] == "histogram"


def test_training_loss_is_drawn_beside_the_test_metrics_without_their_rows() -> None:
    drawn = {"loss": [[1.0, 0.6], [2.0, 0.4]], "test_auc": [[1.0, 0.9], [2.0, 0.95]]}
    loss, auc = views.charts(drawn, {"params": {"test_fraction": 0.2}, "result": {"test_rows": 114}})
    assert loss["y_title"] == "training loss (per training row)" and loss["y_range"] is None
    assert auc["y_title"] == "AUC · 114 held-out rows per point" and auc["y_range"] == [0.0, 1.0]


def test_xgboosts_training_loss_is_titled_with_the_training_rows_it_rests_on() -> None:
    """An xgboost job's history holds its training log-loss and training rows beside the test
    metrics: one more curve, its axis naming the training rows; the counts are not curves."""
    xgb = job_kinds()["xgboost"]
    history = [{"round": 5, "auc": 0.97, "logloss": 0.2, "test_rows": 114, "train_logloss": 0.15, "train_rows": 455},
               {"round": 10, "auc": 0.98, "logloss": 0.15, "test_rows": 114, "train_logloss": 0.08,
                "train_rows": 455}]
    record = {"params": {"test_fraction": 0.2}, "result": {"objective": "binary:logistic", "history": history,
                                                           "federated_eval": {"auc": 0.98, "test_rows": 114}}}
    drawn = views.curves(xgb, record)
    charts = {c["name"]: c for c in views.charts(drawn, record)}
    assert set(charts) == {"auc", "logloss", "train_logloss"}
    assert charts["train_logloss"]["y_title"] == \
        "training log-loss (nats per row) · 455 training rows per point"
    assert charts["logloss"]["y_title"] == "log-loss (nats per row) · 114 held-out rows per point"
    assert charts["train_logloss"]["points"] == [[5.0, 0.15], [10.0, 0.08]]


def test_an_auc_curve_whose_points_rest_on_different_bins_says_so() -> None:
    drawn = {"auc": [[1.0, 0.98], [2.0, 0.99]]}
    same = {"history": [{"round": 1, "eval_bins": 100}, {"round": 2, "eval_bins": 1000, "curve": {"eval_bins": 100}}]}
    assert "bins" not in views.charts(drawn, {"params": {}, "result": same})[0]["y_title"]
    mixed = {"history": [{"round": 1, "eval_bins": 64}, {"round": 2, "eval_bins": 1000}]}
    assert views.charts(drawn, {"params": {}, "result": mixed})[0]["y_title"] == \
        "AUC · score bins differ: 64 from round 1, 1000 from round 2"
