"""Histogram XGBoost with DP, the pure parts: uniform cut points from public bounds and the float32
test the model applies, the level sums, the releases' sensitivities, [data] bounds and their
agreement across members, and the capability an older member lacks."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.config.bounds import bounds_difference, bounds_text, parse_bounds, parse_bounds_text
from fedpeer.jobs import capabilities as caps
from fedpeer.jobs.privacy import bounds_refusal, with_bounds
from fedpeer.kinds import releases
from fedpeer.kinds.xgboost import kind as xgb
from fedpeer.ml import dpbins
from fedpeer.ml.xgb import dpboost as dx
from fedpeer.protocols import dp


def test_uniform_bins_route_as_the_models_float32_split_conditions():
    rng = np.random.default_rng(0)
    bounds = np.array([[0.0, 120.0], [-1e-3, 1e-3], [0.0, 2600.0]])
    cuts = dpbins.uniform_cuts(bounds, 16)
    assert cuts.shape == (3, 15) and np.all(np.diff(cuts, axis=1) > 0)
    X = np.column_stack([rng.uniform(-10, 130, 500), rng.normal(0, 1e-3, 500), rng.uniform(0, 3000, 500)])
    X[:5, 0] = cuts[0, :5]                       # values on a cut go right, as x < condition is left
    bins = dpbins.bin_rows(X, cuts)
    for f in range(3):
        for k in range(1, 16):
            assert np.array_equal(bins[:, f] < k, X[:, f].astype(np.float32) < cuts[f, k - 1])
    with pytest.raises(ValueError, match="too many for a feature's bounds"):
        dpbins.uniform_cuts(np.array([[1.0, 1.0 + 1e-6]]), 1000)


def test_level_sums_are_each_nodes_exact_sums_and_gradients_stay_within_their_bounds():
    rng = np.random.default_rng(1)
    bins = rng.integers(0, 4, size=(300, 2)).astype(np.uint8)
    gq, hq = dx.quantised_derivatives(rng.normal(size=300) * 5, rng.integers(0, 2, 300))
    assert np.abs(gq).max() <= 2 ** dx.VALUE_BITS and 0 <= hq.min() and hq.max() <= 2 ** dx.VALUE_BITS
    positions = rng.integers(1, 4, 300)
    G, H = dx.level_sums(bins, gq, hq, positions, np.array([1, 2]), 4)
    for i, node in enumerate((1, 2)):
        for f in range(2):
            for b in range(4):
                at = (positions == node) & (bins[:, f] == b)
                assert G[i, f, b] == gq[at].sum() and H[i, f, b] == hq[at].sum()


def test_every_level_is_two_releases_of_the_released_features_sensitivity():
    sums = dx.plan(5, 4, 20, 16)
    assert len(sums) == 160
    top = 2.0 ** dx.VALUE_BITS
    assert all(s.l1 == 5 * top and s.l2 == pytest.approx(np.sqrt(5) * top) for s in sums)
    mus = dp.calibrate(sums, 1.0, 1e-12)
    assert len(set(mus)) == 1 and dp.epsilon_of(list(zip(sums, mus)), 1e-12) <= 1.0
    weighted = dp.calibrate(sums, 1.0, 1e-12, [1.0, dx.HESS_NOISE_WEIGHT] * 80)   # H bears more noise
    assert weighted[1] / weighted[0] == pytest.approx(dx.HESS_NOISE_WEIGHT) and weighted[0] < mus[0]
    assert 0.99 < dp.epsilon_of(list(zip(sums, weighted)), 1e-12) <= 1.0


def test_bounds_parse_in_one_line_and_read_back_exactly():
    table = {"age": [0, 120], "mean area": [0.5, 2600.25]}
    parsed = parse_bounds(table)
    assert parsed == {"age": (0.0, 120.0), "mean area": (0.5, 2600.25)}
    assert parse_bounds_text(bounds_text(parsed)) == parsed
    for bad, where in [({"age": [120, 0]}, "bounds.age"), ({"age": [0]}, "bounds.age"), ({"age": "0:1"}, "bounds.age"),
                       ({"age": [0, float("nan")]}, "bounds.age"), ([1, 2], "bounds:")]:
        with pytest.raises(ValueError, match=where) as e:
            parse_bounds(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="expected JSON"):
        parse_bounds_text("age=0:1")
    from fedpeer.config.bounds import BOUNDS_TEXT_MAX
    from fedpeer.wire.frame import STR_BYTES_MAX
    assert bounds_text({"âge": (0.0, 1.0)}).isascii() and BOUNDS_TEXT_MAX < STR_BYTES_MAX   # a proposal decodes


def test_a_member_refuses_bounds_that_are_not_its_own_naming_the_column_and_no_value():
    mine = {"age": (0.0, 120.0), "bmi": (10.0, 60.0)}
    job = {"dp_epsilon": 1.0, "dp_bounds": bounds_text(mine)}
    assert bounds_refusal(job, mine, ["age", "bmi"]) is None
    assert bounds_refusal({"dp_epsilon": 0.0, "dp_bounds": ""}, {}, ["age"]) is None
    assert bounds_refusal({"dp_epsilon": 1.0}, {}, ["age"]) is None                  # a kind without dp_bounds
    assert "needs dp_bounds" in bounds_refusal({"dp_epsilon": 1.0, "dp_bounds": ""}, mine, ["age"])
    other = {**job, "dp_bounds": bounds_text({**mine, "age": (0.0, 110.0)})}
    line = bounds_refusal(other, mine, ["age", "bmi"])
    assert "'age'" in line and "differ" in line and "110" not in line and "120" not in line
    assert "no [data] bounds here" in bounds_refusal(job, {"age": (0.0, 120.0)}, ["age", "bmi"])
    assert "dp_bounds have no bounds for column 'sex'" in bounds_difference(mine, {**mine, "sex": (0, 1)},
                                                                            ["age", "sex"])
    assert bounds_refusal({**job, "dp_bounds": "nonsense"}, mine, ["age"]).startswith("dp_bounds:")


def test_the_proposal_carries_the_proposers_bounds_when_it_gives_none():
    mine = {"age": (0.0, 120.0)}
    filled = with_bounds(xgb.KIND.params, {"dp_epsilon": 1.0}, mine)
    assert parse_bounds_text(filled["dp_bounds"]) == mine
    assert "dp_bounds" not in with_bounds(xgb.KIND.params, {}, mine)                 # no DP: nothing added
    given = with_bounds(xgb.KIND.params, {"dp_epsilon": 1.0, "dp_bounds": '{"age":[1,2]}'}, mine)
    assert given["dp_bounds"] == '{"age":[1,2]}'                                     # the proposer's own words win
    from fedpeer.kinds import stats
    assert "dp_bounds" not in with_bounds(stats.KIND.params, {"dp_epsilon": 1.0}, mine)   # a kind without them


def test_dp_xgboost_needs_dp_trees_of_every_member_even_one_whose_stats_take_dp():
    stats_dp_only = releases.BASELINE_CAPABILITIES | {caps.DP_SKELLAM}
    # as the proposer does: optional parameters (train_loss) settled for the members first
    asked = caps.settled(xgb.KIND, xgb.KIND.check_params({"dp_epsilon": 1.0, "dp_bounds": '{"a":[0,1]}'}),
                         [stats_dp_only])
    assert caps.lacking(xgb.KIND, asked, stats_dp_only) == [caps.DP_TREES]
    plain = caps.settled(xgb.KIND, xgb.KIND.check_params({}), [releases.BASELINE_CAPABILITIES])
    assert caps.lacking(xgb.KIND, plain, releases.BASELINE_CAPABILITIES) == []
    sent = caps.for_members(xgb.KIND, plain, [releases.BASELINE_CAPABILITIES])
    assert not any(name.startswith("dp_") for name in sent)      # an older member gets no dp_* parameter
    assert caps.DP_TREES in caps.declared(xgb.KIND)


def test_data_check_reports_the_bounds_a_dp_job_would_use(tmp_path):
    from fedpeer.app.datacheck import format_report, report
    from fedpeer.config.load import DataSection, JobLimits

    csv = tmp_path / "rows.csv"
    csv.write_text("age,bmi,area,y\n30,22,500,1\n130,25,700,0\n50,31,900,1\n70,28,800,0\n")
    plain = format_report(report(DataSection(csv=str(csv), label="y", positive="1"), JobLimits()))
    assert ("public bounds ([data] bounds): none; a DP histogram xgboost or tree job (dp_epsilon) would be "
            "refused") in plain
    data = DataSection(csv=str(csv), label="y", positive="1", bounds={"age": (0.0, 120.0), "bmii": (10.0, 60.0)})
    text = format_report(report(data, JobLimits()))
    assert "public bounds ([data] bounds): 1 of 3 features; without: bmi, area" in text
    assert "[data] bounds names 'bmii', which is no feature (did you mean 'bmi'?)" in text
    assert "rows outside their bounds (they fall in the first or last bin): age 1" in text


def test_init_writes_where_the_bounds_go_and_the_file_still_loads(tmp_path):
    from fedpeer.app.sitefiles import init_site
    from fedpeer.config import load as cfg

    csv = tmp_path / "rows.csv"
    csv.write_text("age,y\n30,1\n40,0\n")
    conf, _ = init_site(tmp_path / "site", "site-a", "127.0.0.1:7400", data=csv, label="y", positive="1")
    assert "# bounds = { age = [0, 120] }" in conf.read_text()
    assert cfg.load(conf).data.bounds == {}
    conf.write_text(conf.read_text().replace("# bounds = { age = [0, 120] }", "bounds = { age = [0, 120] }"))
    assert cfg.load(conf).data.bounds == {"age": (0.0, 120.0)}
    conf.write_text(conf.read_text().replace("bounds = { age = [0, 120] }", "bounds = { age = [120, 0] }"))
    with pytest.raises(cfg.ConfigError, match=r"data\.bounds\.age: expected \[low, high\]"):
        cfg.load(conf)


def test_a_kind_without_dp_refuses_dp_parameters_in_one_line():
    from fedpeer.errors import JobError
    from fedpeer.kinds.linear.mlp import KIND as mlp

    with pytest.raises(JobError) as e:
        mlp.check_params({"dp_epsilon": 1.0})
    assert str(e.value) == ("mlp does not take differential privacy (dp_epsilon): its sums are released without "
                            "noise; run it without dp_* parameters")


def test_a_dask_site_refuses_dp_xgboost_at_admission_before_any_charge():
    from fedpeer.jobs.kind import dask_refusal
    from fedpeer.kinds.catalog import job_kinds

    line = dask_refusal(xgb.KIND, xgb.KIND.check_params({"dp_epsilon": 1.0}), job_kinds())
    assert "not xgboost with dp_epsilon" in line
    assert dask_refusal(xgb.KIND, xgb.KIND.check_params({}), job_kinds()) is None
