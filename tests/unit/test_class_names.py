"""Text people read says the classes by their names — the site's [data] positive class and the
label's other value — instead of positive / negative and 0 / 1: tree rules, `predict`'s prediction
column, stats' share; tables show only evaluated rows, and a hidden class mix is explained once."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedpeer.app import jobtext
from fedpeer.app.predict import _named
from fedpeer.app.sitefiles import init_site
from fedpeer.config.load import load
from fedpeer.jobs.report import evaluated, size
from fedpeer.kinds import stats
from fedpeer.kinds.linear import text as linear_text
from fedpeer.kinds.tree.text import rule_lines


@pytest.fixture
def config(tmp_path: Path):
    data = tmp_path / "cohort.csv"
    data.write_text("Id,age,Class\n1,50,malignant\n2,60,NA\n3,61,benign\n")
    return load(init_site(tmp_path / "a", "a", "127.0.0.1:17450", data=data, label="Class",
                          positive="malignant")[0])


def test_the_sites_class_names_come_from_its_data(config, tmp_path: Path) -> None:
    assert jobtext.site_class_names(config) == ("benign", "malignant")
    bare = load(init_site(tmp_path / "b", "b", "127.0.0.1:17451")[0])
    assert jobtext.site_class_names(bare) is None


def test_tree_rules_name_the_classes_and_explain_a_hidden_mix_once() -> None:
    rules = ["if a <= 1 then negative (197 rows, 53.8% of the federation's; class mix not shown: a class has "
             "fewer than 5 rows here)",
             "if a > 1 and b <= 2 then positive (20 rows, 5.5% of the federation's; negative 13, positive 7)",
             "if a > 1 and b > 2 then positive (96 training rows match; class mix not shown: a class has fewer "
             "than 5 rows here)"]
    result = {"classes": ["negative", "positive"], "class_names": ["benign", "malignant"]}
    lines = rule_lines(result, rules)
    assert lines[0] == "    if a <= 1 then benign (197 rows, 53.8% of the federation's)*"
    assert lines[1].endswith("then malignant (20 rows, 5.5% of the federation's; benign 13, malignant 7)")
    assert lines[2].endswith("then malignant (96 training rows match)*")
    assert sum("class mix not shown" in line for line in lines) == 1 and lines[3].startswith("    * class mix")
    multi = rule_lines({"classes": ["a", "b", "c"], "class_names": ["benign", "malignant"]}, rules[1:2])
    assert "then positive" in multi[0]          # not a binary tree: its own class names stay


def test_stats_says_whose_share_it_is() -> None:
    result = {"count": 569, "participants": ["site-1"], "positive_share": 0.373, "std_kind": "sample",
              "mean": {"x": 1.0}, "std": {"x": 0.5}}
    assert "positive share 0.373" in stats.describe(result)[0]
    named = stats.describe({**result, "class_names": ["benign", "malignant"]})[0]
    assert "share of malignant 0.373 (the rest benign)" in named and "positive" not in named


def test_format_job_gives_the_kind_the_sites_class_names() -> None:
    record = {"id": "stats-1", "kind": "stats", "state": "done", "proposer": "a", "members": [{"name": "a"}],
              "params": {}, "elapsed_s": 1.0, "rows": 3,
              "result": {"count": 3, "participants": ["a"], "positive_share": 0.5, "std_kind": "sample",
                         "mean": {"x": 1.0}, "std": {"x": 0.5}}}
    assert "share of M 0.500 (the rest B)" in jobtext.format_job(record, ("B", "M"))
    assert "positive share" in jobtext.format_job(record)


def test_predict_writes_the_class_and_keeps_the_score(config) -> None:
    rows = [{"row": 1, "score": 0.9, "prediction": 1}, {"row": 2, "score": 0.2, "prediction": 0}]
    assert _named(rows, config) == [{"row": 1, "score": 0.9, "prediction": "malignant"},
                                    {"row": 2, "score": 0.2, "prediction": "benign"}]
    regression = [{"row": 1, "prediction": 3.5}]
    assert _named(regression, config) == regression


def test_tables_show_only_evaluated_rows_and_columns() -> None:
    rows = [("ROUND", "TREES", "AUC", "LOG-LOSS"), (1, 3, "-", "-"), (2, 3, "-", "-"), (3, 3, "0.9", "-")]
    assert evaluated(rows, 2) == [("ROUND", "TREES", "AUC"), (3, 3, "0.9")]
    none = [("ROUND", "AUC"), (1, "-"), (2, "-")]
    assert evaluated(none, 1) == [("ROUND",), (1,), (2,)]
    result = {"mode": "exact", "solver": "newton", "C": 1.0, "status": "converged", "iterations": 1,
              "secure_sums": 2, "members": ["a"], "lost": [], "classes": ["0", "1"], "features": ["x"],
              "coef": [[0.5]], "intercept": [0.1],
              "history": [{"iteration": 0, "loss": 0.69, "grad_max": 0.3, "step": 0, "test_auc": None}]}
    text = "\n".join(linear_text.describe("logreg", result))
    assert "ITERATION" in text and "TEST AUC" not in text


def test_sizes_read_in_binary_units() -> None:
    assert [size(n) for n in (512, 12_595, 10_800_000, 3 * 2**30)] == ["512 bytes", "12.3 KiB", "10.3 MiB",
                                                                        "3.0 GiB"]
