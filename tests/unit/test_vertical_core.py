"""Vertically partitioned data without the network: [data] partition and id_column, a vertical
site's rows and their refusals (fedpeer/data/vertical.py), the group arithmetic of the private set
intersection (fedpeer/protocols/psi.py), and LLF-CM's arithmetic (fedpeer/ml/cluster/vertical.py)
equal to scikit-learn's KMeans on the joined rows from the same initial centres."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedpeer.config import load as cfg
from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.site import load_site
from fedpeer.data.spec import VERTICAL_FINGERPRINT, data_difference
from fedpeer.data.vertical import VerticalBlock
from fedpeer.errors import ConfigError, DataError
from fedpeer.ml.cluster import vertical as vc
from fedpeer.protocols import psi

RTOL = 1e-9


# ---------------------------------------------------------------------------------------------
# [data] partition
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("table, key, problem", [
    ({"partition": "diagonal"}, "data.partition", "horizontal"),
    ({"partition": "vertical"}, "data.id_column", "missing"),
    ({"id_column": "ID"}, "data.id_column", "only with partition"),
    ({"partition": "vertical", "id_column": "ID", "label": "ID"}, "data.id_column", "also [data] label"),
    ({"partition": "vertical", "id_column": "ID", "test_csv": "t.csv"}, "data.test_csv", "vertical"),
])
def test_partition_settings_are_checked(tmp_path: Path, table: dict, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg._data(tmp_path / "peers.toml", {"csv": "d.csv", **table})
    assert err.value.key == key and problem in err.value.problem


def test_a_vertical_section_loads(tmp_path: Path) -> None:
    data = cfg._data(tmp_path / "peers.toml", {"csv": "d.csv", "partition": "vertical", "id_column": "ID"})
    assert data.partition == "vertical" and data.id_column == "ID"


def test_a_mixed_federation_is_told_which_partition_to_set() -> None:
    text = data_difference(VERTICAL_FINGERPRINT, ("a",), b"\x01" * 32, ["b"], "site-2", "site-1")
    assert "its data is horizontal, site-1's is vertical" in text and 'partition = "vertical" at site-2' in text
    assert "columns differ" in data_difference(b"\x02" * 32, ("a",), b"\x01" * 32, ["b"], "site-2", "site-1")


# ---------------------------------------------------------------------------------------------
# A vertical site's rows
# ---------------------------------------------------------------------------------------------

def _site(tmp_path: Path, text: str, **data: object) -> VerticalBlock:
    path = tmp_path / "block.csv"
    path.write_text(text)
    section = DataSection(csv=str(path), partition="vertical", id_column="ID", **data)   # type: ignore[arg-type]
    block, test = load_site(section, JobLimits(), needs_label=True, binary=True, rows_min=7)
    assert test is None and isinstance(block, VerticalBlock)
    return block


def test_a_vertical_block_holds_its_columns_and_ids(tmp_path: Path) -> None:
    block = _site(tmp_path, "ID,a,label,b\n p1 ,1,x,2\np2,3,y,4\n", label="label")
    assert block.features == ("a", "b") and list(block.ids) == ["p1", "p2"]
    assert block.fingerprint == VERTICAL_FINGERPRINT
    assert block.aligned_rows_min == 7 and block.partition == "vertical"
    np.testing.assert_array_equal(block.aligned([1, 0]), [[3.0, 4.0], [1.0, 2.0]])


def test_a_repeated_id_is_refused_naming_it_here_only(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        _site(tmp_path, "ID,a\np1,1\np2,2\np1,3\n")
    assert "'p1' (2 rows)" in str(err.value) and "one row per entity" in str(err.value)
    assert "p1" not in err.value.public and "ID column 'ID'" in err.value.public


def test_a_missing_id_column_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        _site(tmp_path, "id,a\np1,1\n")
    assert "ID column 'ID' not found (did you mean 'id'?)" in str(err.value)
    assert err.value.public == "its data has no ID column 'ID'; fix [data] id_column there"


def test_a_row_without_an_id_is_refused_or_dropped(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        _site(tmp_path, "ID,a\np1,1\n,2\n")
    assert "ID column 'ID' has 1 missing" in str(err.value)
    assert _site(tmp_path, "ID,a\np1,1\n,2\n", missing="drop").rows == 1


# ---------------------------------------------------------------------------------------------
# The intersection's group arithmetic
# ---------------------------------------------------------------------------------------------

def test_hashing_is_per_job_and_blinding_commutes() -> None:
    h = psi.hash_ids("job-1", ["a", "b"])
    assert h == psi.hash_ids("job-1", ["a", "b"]) and h != psi.hash_ids("job-2", ["a", "b"]) and h[0] != h[1]
    a, b = psi.new_scalar(bytes(range(64))), psi.new_scalar(bytes(range(1, 65)))
    ab = psi.blind(psi.blind(h, a, True), b, True)
    assert ab == psi.blind(psi.blind(h, b, True), a, True)
    assert psi.blind(psi.blind(ab, psi.inverse(a), True), psi.inverse(b), True) == h


def test_a_point_outside_the_group_is_refused() -> None:
    h = psi.hash_ids("job", ["a"])
    small_order = bytes(32)                                   # the identity: of small order
    assert psi.blind([*h, small_order], psi.new_scalar(bytes(64 * [7])), True) is None


# ---------------------------------------------------------------------------------------------
# LLF-CM arithmetic
# ---------------------------------------------------------------------------------------------

def _blocks(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    from sklearn.datasets import load_wine
    X = load_wine().data
    return X, [X[:, :4], X[:, 4:9], X[:, 9:]]


@pytest.mark.parametrize("rows", [(0, 60, 130), (5, 6, 7)])
def test_vertical_lloyd_equals_scikit_learn_on_the_joined_rows(rows: tuple[int, ...]) -> None:
    from sklearn.cluster import KMeans
    X, blocks = _blocks()
    C0 = X[list(rows)]
    drivers = vc.reference_vertical(blocks, [C0[:, :4], C0[:, 4:9], C0[:, 9:]], tol=0.0)
    centres = np.hstack([d.restarts[0].centers for d in drivers])
    km = KMeans(3, init=C0, n_init=1, tol=0.0, max_iter=300, algorithm="lloyd").fit(X)
    np.testing.assert_allclose(centres, km.cluster_centers_, rtol=RTOL)
    r = drivers[0].restarts[0]
    np.testing.assert_array_equal(r.labels, km.labels_)
    assert r.converged and r.last_change == 0.0 and r.iterations == km.n_iter_
    np.testing.assert_allclose(r.inertia, km.inertia_, rtol=RTOL)


def test_the_llf_cm_stop_rule_ends_on_a_small_change_of_the_distances() -> None:
    X, blocks = _blocks()
    C0 = X[[5, 6, 7]]                 # close together: 16 centre updates to the fixed point
    strict = vc.reference_vertical(blocks, [C0[:, :4], C0[:, 4:9], C0[:, 9:]], tol=0.0)[0].restarts[0]
    loose = vc.reference_vertical(blocks, [C0[:, :4], C0[:, 4:9], C0[:, 9:]], tol=1e-2)[0].restarts[0]
    assert loose.converged and loose.iterations < strict.iterations and 0 < loose.last_change
    capped = vc.reference_vertical(blocks, [C0[:, :4], C0[:, 4:9], C0[:, 9:]], tol=0.0, max_iter=2)[0].restarts[0]
    assert capped.iterations == 2 and not capped.converged and len(capped.history) == 3


def test_totals_no_honest_sites_can_give_are_refused() -> None:
    X, blocks = _blocks()
    C0 = X[[0, 60, 130]]
    parts = [vc.partials(Z, C[None]) for Z, C in zip(blocks, [C0[:, :4], C0[:, 4:9], C0[:, 9:]])]
    D, S = sum(p[0] for p in parts), sum(p[1] for p in parts)
    vc.check_totals(D, S, *parts[0])
    cases = {"at least 0": (D - 2 * D.max() * (np.arange(D.size) == 7).reshape(D.shape), S),
             "this site's part": (parts[0][0] * 0.5, parts[0][1]),
             "triangle": (D, S * 0.01)}
    for words, (bad_D, bad_S) in cases.items():
        with pytest.raises(ValueError, match="triangle" if words == "triangle" else words):
            vc.check_totals(bad_D, bad_S, *parts[0])
