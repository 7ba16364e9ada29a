"""Vertically partitioned sites over the in-memory network, in virtual time: the private set
intersection (fedpeer/protocols/psi.py), `kmeans` over vertical sites (fedpeer/kinds/cluster/vertical.py)
equal to scikit-learn's KMeans on the joined rows from the same initial centres, fuzzy c-means equal
to the horizontal reference on the joined rows, `stats` (fedpeer/kinds/vertical_stats.py) equal to
numpy on them, and the refusals: no common ID, a site's rows_min, a column held twice, a total no
honest members can give."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.data.vertical import VerticalBlock
from fedpeer.jobs.kind import ImplausibleTotal, JobContext, JobFailsEverywhere
from fedpeer.kinds import aligned as al
from fedpeer.kinds import vertical_stats as vs
from fedpeer.kinds.cluster import kmeans as kj
from fedpeer.kinds.cluster import vertical as kv
from fedpeer.ml.cluster import kmeans as cl
from fedpeer.protocols import psi
from fedpeer.protocols.psi import PsiPoints
from fedpeer.testing.members import member_keys, poisoned_sums, run_members

RTOL = 1e-9


async def _inline(fn, *args):
    return fn(*args)


def three_sites(seed: int = 0, missing: float = 0.1) -> tuple[list[VerticalBlock], np.ndarray]:
    """Breast cancer's 30 columns as three blocks of 10, each site's rows shuffled and missing a
    different ~10 % of the patients; and the joined rows of the patients every site holds, in ID order."""
    from sklearn.datasets import load_breast_cancer
    X = load_breast_cancer().data
    ids = np.array([f"patient-{i:04d}" for i in range(len(X))])
    rng = np.random.default_rng(seed)
    sites, held = [], []
    for m in range(3):
        keep = np.flatnonzero(rng.random(len(X)) >= missing)
        order = rng.permutation(keep)
        block = np.ascontiguousarray(X[order][:, 10 * m:10 * m + 10])
        block.setflags(write=False)
        sites.append(VerticalBlock(tuple(f"c{j}" for j in range(10 * m, 10 * m + 10)), block, ids[order], "ID"))
        held.append(set(keep))
    common = sorted(set.intersection(*held))
    return sites, X[common]


def run_job(run, sites: list, params: dict, **network) -> list:
    keys, names = member_keys("vertical", len(sites))     # sorted: site i is i-th in ring order
    return run_members(keys, lambda net, i, k: run(net.channel(k), params, JobContext(names[k], names, 2_000,
                                                                                        data=sites[i]), _inline),
                       **network)


def same_everywhere(results: list) -> dict:
    assert all(isinstance(r, dict) for r in results), results
    first = {k: v for k, v in results[0].items() if k != "_model"}
    assert all({k: v for k, v in r.items() if k != "_model"} == first for r in results[1:])
    return results[0]


def init_text(C: np.ndarray) -> str:
    return ";".join(",".join(repr(float(v)) for v in row) for row in C)


# ---------------------------------------------------------------------------------------------
# The intersection
# ---------------------------------------------------------------------------------------------

def intersect(id_sets: list[list[str]], rows_min: list[int] | None = None, **network) -> tuple[list, list]:
    keys, _ = member_keys("psi", len(id_sets))
    mins = rows_min or [0] * len(id_sets)
    holder: list = []

    async def member(net, i, k):
        holder.append(net)
        return await psi.intersect(net.channel(k), id_sets[i], hop_timeout_ms=2_000, rows_min=mins[i],
                                   offload=_inline)
    return run_members(keys, member, **network), holder


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_member_gets_the_same_ordered_intersection(n: int) -> None:
    rng = np.random.default_rng(n)
    universe = [f"id-{i}" for i in range(300)]
    id_sets = [[universe[j] for j in rng.permutation(300) if rng.random() > 0.2] for _ in range(n)]
    out, _ = intersect(id_sets)
    common = set.intersection(*map(set, id_sets))
    assert all(isinstance(r, psi.Intersection) for r in out), out
    ordered = [[id_sets[i][p] for p in r.rows] for i, r in enumerate(out)]
    assert all(o == ordered[0] for o in ordered) and set(ordered[0]) == common and len(ordered[0]) == len(common)
    assert len({r.digest for r in out}) == 1
    assert all(r.sizes == out[0].sizes for r in out) and sorted(out[0].sizes.values()) == sorted(map(len, id_sets))


def test_no_common_id_ends_the_intersection_everywhere() -> None:
    out, _ = intersect([["a", "b"], ["c", "d"], ["a", "c"]])
    assert all(isinstance(r, psi.NoCommonIds) for r in out), out


def test_a_site_below_its_rows_min_refuses_before_any_common_id_is_revealed() -> None:
    id_sets = [[f"x{i}" for i in range(50)], [f"x{i}" for i in range(10, 60)], [f"x{i}" for i in range(20, 70)]]
    out, nets = intersect(id_sets, rows_min=[0, 0, 31])          # 30 in common
    assert isinstance(out[2], psi.TooFewCommon) and "rows_min" in str(out[2])
    assert all(isinstance(r, psi.RefusedByMember) for r in out[:2]), out
    revealed = [m for _, _, m in nets[0].sent if isinstance(m, PsiPoints) and ("/u/" in m.tag or "/ids/" in m.tag)]
    assert revealed == []
    ok, _ = intersect(id_sets, rows_min=[0, 0, 30])
    assert all(r.count == 30 for r in ok)


# ---------------------------------------------------------------------------------------------
# kmeans over vertical sites
# ---------------------------------------------------------------------------------------------

def test_vertical_kmeans_over_three_sites_equals_scikit_learn_on_the_joined_rows() -> None:
    from sklearn.cluster import KMeans
    sites, joined = three_sites()
    C0 = joined[[3, 120, 260]]
    params = kj.KIND.check_params({"k": 3, "tol": 0.0, "max_iter": 300, "init": init_text(C0),
                                   "standardize": False})
    fed = same_everywhere(run_job(kv.run_vertical, sites, params))
    km = KMeans(3, init=C0, n_init=1, tol=0.0, max_iter=300, algorithm="lloyd").fit(joined)
    want = km.cluster_centers_[cl.canonical_order(km.cluster_centers_)]
    np.testing.assert_allclose(fed["centers"], want, rtol=RTOL)
    np.testing.assert_allclose(fed["inertia"], km.inertia_, rtol=RTOL)
    assert fed["rows"] == len(joined) and fed["iterations"] == km.n_iter_ and fed["converged"]
    assert sorted(fed["cluster_sizes"]) == sorted(np.bincount(km.labels_).tolist())
    assert fed["features"] == [f"c{j}" for j in range(30)] and fed["partition"] == "vertical"


def test_vertical_kmeans_standardized_with_restarts_is_the_same_everywhere_and_matches_scikit_learn() -> None:
    from sklearn.cluster import KMeans
    sites, joined = three_sites(seed=4)
    params = kj.KIND.check_params({"k": 4, "tol": 0.0, "n_init": 3, "seed": 5, "standardize": True})
    results = run_job(kv.run_vertical, sites, params)
    fed = same_everywhere(results)
    Z = (joined - joined.mean(axis=0)) / joined.std(axis=0)
    kept = results[0]["_model"]["centers"]                     # clustering space, canonical order
    km = KMeans(4, init=kept, n_init=1, tol=0.0, max_iter=300, algorithm="lloyd").fit(Z)
    np.testing.assert_allclose(km.cluster_centers_, kept, rtol=RTOL, atol=1e-12)   # a fixed point of Lloyd
    np.testing.assert_allclose(fed["inertia"], km.inertia_, rtol=RTOL)
    assert fed["restarts"] == 3 and fed["inertia_units"] == "standardized features"


def test_vertical_fuzzy_c_means_equals_the_reference_on_the_joined_rows() -> None:
    sites, joined = three_sites(seed=2)
    C0 = joined[[10, 200, 330]]
    params = kj.KIND.check_params({"k": 3, "tol": 0.0, "max_iter": 12, "fuzziness": 2.0, "init": init_text(C0),
                                   "standardize": False})
    fed = same_everywhere(run_job(kv.run_vertical, sites, params))
    space, lloyd, _ = cl.reference_kmeans(joined, k=3, seed=0, n_init=1, standardize=False, tol=0.0, max_iter=12,
                                          fuzziness=2.0, init=C0)
    want = lloyd.restarts[0].centers
    np.testing.assert_allclose(fed["centers"], want[cl.canonical_order(want)], rtol=RTOL)
    assert fed["iterations"] == 12 and not fed["converged"]


def test_a_distance_no_honest_members_can_give_ends_the_job_everywhere() -> None:
    sites, joined = three_sites(seed=3)
    params = kj.KIND.check_params({"k": 3, "tol": 0.0, "max_iter": 5, "init": init_text(joined[[1, 2, 3]])})
    keys, _ = member_keys("vertical", 3)

    def poison(tag, vector):      # a huge negative partial distance in round 2
        if not tag.startswith("kmeans/round2"):
            return None
        out = vector.copy()
        out[2] = (int(out[2]) + (1 << 31)) & 0xFFFFFFFF
        return out
    with poisoned_sums(al, keys[1], poison) as poisoned:
        results = run_job(kv.run_vertical, sites, params)
    assert poisoned == ["kmeans/round2"]
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert "secure sum 'kmeans/round2'" in str(results[0]) and "at least" in str(results[0])


def test_a_column_held_by_two_sites_is_refused() -> None:
    sites, _ = three_sites()
    twin = VerticalBlock(("c0", "other"), sites[2].X[:, :2].copy(), sites[2].ids, "ID")
    params = kj.KIND.check_params({"k": 2})
    results = run_job(kv.run_vertical, [sites[0], sites[1], twin], params)
    assert all(isinstance(r, JobFailsEverywhere) and "column 'c0' is held by two members" in str(r) for r in results)


def test_no_common_patient_fails_the_kmeans_job_everywhere() -> None:
    sites, _ = three_sites()
    strangers = VerticalBlock(sites[2].features, sites[2].X, np.array([f"other-{v}" for v in sites[2].ids]), "ID")
    results = run_job(kv.run_vertical, [sites[0], sites[1], strangers], kj.KIND.check_params({"k": 2}))
    assert all(isinstance(r, JobFailsEverywhere) and "no ID is held by every member" in str(r) for r in results)


# ---------------------------------------------------------------------------------------------
# stats over vertical sites
# ---------------------------------------------------------------------------------------------

def test_vertical_stats_equal_numpy_on_the_joined_rows() -> None:
    sites, joined = three_sites(seed=1)
    fed = same_everywhere(run_job(vs.run_vertical, sites, {"bins": 8, "secure_sum": "pairwise",
                                                           "secure_sum_compact": True}))
    assert fed["count"] == len(joined) and list(fed["mean"]) == [f"c{j}" for j in range(30)]
    np.testing.assert_allclose(list(fed["mean"].values()), joined.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(list(fed["std"].values()), joined.std(axis=0, ddof=1), rtol=1e-12)
    for j, h in enumerate(fed["histograms"].values()):
        assert h["below"] + sum(h["counts"]) + h["above"] == len(joined)
        np.testing.assert_array_equal(h["counts"], np.histogram(joined[:, j], bins=h["edges"])[0])
    assert list(fed["ids_per_site"].values()) == [s.rows for s in sites]
    assert vs.describe(fed)[0].startswith(f"  federation: {len(joined)} aligned entities")


@settings(max_examples=6, deadline=None)
@given(entry=st.integers(0, 10_000), amount=st.integers(1, 2**64 - 1), gather=st.sampled_from(["moments", "spread"]),
       liar=st.integers(0, 2))
def test_a_member_shifting_anothers_gathered_values_is_caught_by_that_member(entry: int, amount: int, gather: str,
                                                                              liar: int) -> None:
    """A gathered sum carries every member's exact values side by side; a member that adds
    anything to another member's entries is caught by the member whose values changed: the job
    ends (there, at once, naming the sum and the check; no member returns a result)."""
    sites, _ = three_sites(seed=1)
    keys, _ = member_keys("vertical", 3)
    widths = [s.X.shape[1] for s in sites]           # sites' own columns, in ring order = key order
    ring = sorted(range(3), key=lambda i: keys[i])
    per_column = 2 if gather == "moments" else 1 + 8 + 2
    starts = np.cumsum([0] + [widths[i] for i in ring])
    mine = ring.index(liar)

    def poison(tag, vector):
        if not tag.endswith("/" + gather):
            return None
        others = [j for j in range(int(starts[-1]) * per_column)
                  if not starts[mine] * per_column <= j < starts[mine + 1] * per_column]
        out = vector.copy()
        out[others[entry % len(others)]] += np.uint64(amount)
        return out
    with poisoned_sums(al, keys[liar], poison) as poisoned:
        results = run_job(vs.run_vertical, sites, {"bins": 8, "secure_sum": "pairwise",
                                                   "secure_sum_compact": True})
    assert poisoned, "nothing was gathered"
    assert not any(isinstance(r, dict) for r in results), results
    caught = [str(r) for r in results if isinstance(r, ImplausibleTotal)]
    assert any("own values come back" in text for text in caught), results


class _AlwaysAltered:
    """A member's channel that answers every gather check "my values came back altered"."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.inner, name)

    async def send(self, dst, msg) -> None:  # noqa: ANN001
        if isinstance(msg, al.GatherCheck):
            msg = al.GatherCheck(msg.tag, False)
        return await self.inner.send(dst, msg)


@pytest.mark.parametrize("kind", ["stats", "kmeans"])
@pytest.mark.parametrize("liar", [0, 2])
def test_a_member_always_claiming_altered_values_is_named_and_stalls_nothing(kind: str, liar: int) -> None:
    """Issue 38, finding 3, from the attacker's side: a member that answers every gather check
    "not intact" used to fail every vertical job at its first gather, never named. Every member
    committed to its own values before the sum, so every member sees that all values came back
    as committed: the claim is refuted, its maker named in every honest member's result, and the
    job ends `done` with the same result at every honest member."""
    sites, _ = three_sites(seed=2)
    keys, names = member_keys("vertical", 3)
    if kind == "stats":
        run, params = vs.run_vertical, {"bins": 8, "secure_sum": "pairwise", "secure_sum_compact": True}
    else:
        run, params = kv.run_vertical, kj.KIND.check_params({"k": 3, "seed": 3, "secure_sum": "pairwise"})

    def member(net, i, k):  # noqa: ANN001, ANN202
        ch = _AlwaysAltered(net.channel(k)) if i == liar else net.channel(k)
        return run(ch, params, JobContext(names[k], names, 2_000, data=sites[i]), _inline)
    results = run_members(keys, member)
    honest = [r for i, r in enumerate(results) if i != liar]
    fed = same_everywhere(honest)
    assert fed["false_claims"] == [names[keys[liar]]], fed
