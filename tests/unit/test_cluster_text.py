"""What `fedpeer job show` prints of a clustering result (fedpeer/kinds/cluster/text.py): centres
by column name, one column per cluster, in blocks; bytes as KiB / MiB, never a raw count."""

from __future__ import annotations

import re

from fedpeer.kinds.catalog import job_kinds
from fedpeer.kinds.cluster import text


def kmeans_result(k: int, d: int, **over) -> dict:
    features = [f"col_{j}" for j in range(d)]
    return {"k": k, "features": features, "rows": 569, "participants": ["site-1", "site-2"],
            "centers": [[c * 10.0 + j / 4 for j in range(d)] for c in range(k)], "inertia": 1234.5,
            "inertia_units": "standardized features", "iterations": 7, "converged": True,
            "history": [{"round": 1, "inertia": 2000.0}, {"round": 2, "inertia": 1234.5}],
            "cluster_sizes": [100 + c for c in range(k - 1)] + ["< 5"], "restarts": 10, "kept_restart": 3,
            "fuzziness": 1.0, "standardized": True, "secure_sum": "allreduce", "secure_sums": 9,
            "bytes_sent_per_site": 123_456, **over}


def test_kmeans_centres_are_printed_by_column_name_and_bytes_in_kib() -> None:
    lines = job_kinds()["kmeans"].describe(kmeans_result(3, 2, features=["mean_radius", "mean_area"]))
    shown = "\n".join(lines)
    assert "120.6 KiB sent per site" in shown and "123456" not in shown
    assert not re.search(r"\d+ bytes", shown)
    at = lines.index("  centres, in the data's original units (one column per cluster):")
    assert lines[at + 1].split("\n") == ["  COLUMN       CLUSTER 0  CLUSTER 1  CLUSTER 2",
                                         "  rows         100        101        < 5",
                                         "  mean_radius  0          10         20",
                                         "  mean_area    0.25       10.25      20.25"]


def test_many_clusters_come_in_blocks_and_many_columns_are_cut_with_a_note() -> None:
    lines = text.centre_lines("centres", [f"c{j}" for j in range(70)], [[float(c)] * 70 for c in range(10)],
                              list(range(10)))
    blocks = [line for line in lines if line.startswith("  COLUMN")]
    assert len(blocks) == 2 and "CLUSTER 7" in blocks[0] and "CLUSTER 8" in blocks[1] and "CLUSTER 8" not in blocks[0]
    assert "c63" in lines[1] and "c64" not in "\n".join(lines)
    assert lines[-1] == "  (6 more columns: fedpeer job show --json)"
    unnamed = text.centre_lines("centres", [], [[1.0, 2.0]], [5])       # a result without its columns' names
    assert "column 2" in unnamed[1]


def test_gmm_means_carry_their_weights_and_dp_centres_say_they_are_noised() -> None:
    gmm = {**kmeans_result(2, 2), "means": [[1.0, 2.0], [3.0, 4.0]], "weights": [0.25, 0.75],
           "log_likelihood": -100.0, "bic": 250.0, "parameters": 11, "covariance": "diag",
           "history": [{"round": 1, "log_likelihood": -100.0}], "bytes_sent_per_site": 3 * 2**20}
    shown = "\n".join(job_kinds()["gmm"].describe(gmm))
    assert "3.0 MiB sent per site" in shown and "  means, in the data's original units" in shown
    assert re.search(r"weight\s+0\.2500\s+0\.7500", shown) and re.search(r"col_1\s+2\s+4", shown)
    dp = {**kmeans_result(2, 2), "privacy": {"epsilon": 1.0, "delta": 1e-6, "clip": 5.0}}
    shown = "\n".join(job_kinds()["kmeans"].describe(dp))
    assert "centres (noised sums)" in shown and "col_0" in shown
