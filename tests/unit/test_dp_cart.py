"""The DP tree's arithmetic without the network: the split rule on noised counts, the node and leaf
estimates, the releases' sensitivities and the model's thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.ml import dpbins
from fedpeer.ml.tree import dpcart
from fedpeer.ml.tree.model import check_cart, predict_value
from fedpeer.protocols import dp


def _grow(X, y, bounds, n_bins, depth, var_cell=0.0, noise=None, criterion="gini"):
    cuts = dpbins.uniform_cuts(np.asarray(bounds, dtype=float), n_bins)
    bins, tree = dpbins.bin_rows(X, cuts), dpcart.DpCart()
    positions = np.zeros(len(y), dtype=np.int64)
    for d in range(depth):
        if not tree.frontier:
            break
        C = dpcart.level_counts(bins, y, positions, np.asarray(tree.frontier), n_bins, 2).astype(float)
        if noise is not None:
            C = C + noise.normal(0.0, np.sqrt(var_cell), C.shape)
        dpcart.decide(tree, C, var_cell, criterion, 5, last=d == depth - 1)
        dpcart.route(tree, bins, positions)
    return dpcart.finish(tree, cuts, criterion, 2), cuts


@pytest.mark.parametrize("criterion", ["gini", "entropy"])
def test_without_noise_the_rule_finds_the_separating_cut_and_a_value_on_the_cut_goes_right(criterion):
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 8, size=(2000, 2))
    y = (X[:, 1] >= 5.0).astype(np.int64)              # a cut of 8 uniform bins over [0, 8]
    cart, cuts = _grow(X, y, [[0, 8], [0, 8]], 8, 3, criterion=criterion)
    check_cart(cart, 2)
    assert cart.feature[0] == 1 and cart.n_leaves == 2 and cart.n_node_samples[0] == 2000
    assert np.array_equal(np.argmax(predict_value(cart, X), axis=1), y)
    on_cut = np.array([[1.0, cuts[1, 4]]])
    assert np.argmax(predict_value(cart, on_cut), axis=1)[0] == 1          # x < cut goes left, as the bins


def test_under_noise_the_tree_stays_well_formed_and_no_side_is_noise_alone():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 8, size=(300, 3))
    y = (X[:, 0] + rng.normal(0, 1, 300) > 4).astype(np.int64)
    var = 400.0                                         # a cell's noise sd 20 against ~6 rows a cell
    cart, _ = _grow(X, y, [[0, 8]] * 3, 16, 4, var, np.random.default_rng(2))
    check_cart(cart, 2)
    assert cart.n_leaves <= 2          # a side needs 2 sd of its rows' noise: 2·√(400·2·k), at least 57 rows


def test_gini_takes_the_noises_expectation_out_of_the_squares():
    counts = np.array([[50.0, 50.0]])
    assert dpcart.weighted_impurity(counts, 0.0, "gini")[0] == pytest.approx(50.0)
    assert dpcart.weighted_impurity(counts, 100.0, "gini")[0] == pytest.approx(100 - (5000 - 200) / 100)
    assert dpcart.weighted_impurity(np.array([[-3.0, -1.0]]), 1.0, "entropy")[0] == 0.0    # floored at 0


def test_every_level_is_one_release_of_sensitivity_f_and_root_f():
    sums = dpcart.plan(20, 4, 16, 2)
    assert [s.entries for s in sums] == [640, 1280, 2560, 5120]
    assert all(s.l1 == 20 and s.l2 == pytest.approx(np.sqrt(20)) for s in sums)
    mus = dp.calibrate(sums, 1.0, 1e-12)
    assert len(set(mus)) == 1 and dp.epsilon_of(list(zip(sums, mus)), 1e-12) <= 1.0
