"""[data] engine = "dask" in real daemons: three sites, one of them keeping its rows on a Dask
LocalCluster (2 worker processes, started by the test), run stats and bofrf with the results of the
same jobs over the same rows held in memory; a job kind the engine lacks and an unreachable scheduler
each fail the job with a reason naming the site — the daemon keeps serving. (Histogram XGBoost on a
Dask site, model byte for byte the memory engine's, is tests/unit/test_dask_engine.py: the same
job code over the in-memory network, which is what the daemon runs after the load tested here.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.daemon.admin import request
from tests.unit.test_dask_engine import write_site

pytestmark = pytest.mark.integration
SPLIT = (0, 190, 380, 569)


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c:
        yield c


def _attach(h, tmp_path: Path, scheduler: str | None) -> None:
    """Site k holds rows SPLIT[k]:SPLIT[k+1]; site 1 as Parquet parts on the cluster when scheduler is set."""
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer()
    labels = np.where(raw.target == 0, "malignant", "benign")
    names = [f"f{j}" for j in range(raw.data.shape[1])]
    for k, site in enumerate(h.sites):
        a, b = SPLIT[k], SPLIT[k + 1]
        files = write_site(tmp_path / f"rows{k}", raw.data[a:b], labels[a:b], names)
        data = {"label": "diagnosis", "positive": "malignant", "ignore": ["id"]}
        if k == 0 and scheduler is not None:
            data |= {"parquet": str(files["parts"]), "engine": "dask", "scheduler": scheduler}
        else:
            data |= {"parquet": str(files["whole_parquet"])}
        add_peers(site.config_path, [], {"data": data})
        site.config = cfg.load(site.config_path)
    assert pq.read_metadata(tmp_path / "rows0" / "whole.parquet").num_rows == 190


async def _run(h, i: int, kind: str, params: dict, timeout_s: float = 90) -> dict:
    job_id = await h.propose(i, kind, params)
    return await h.wait_job(job_id, timeout_s=timeout_s)


def _in_process(h, tmp_path: Path, kind, params: dict) -> list[dict]:
    """The same job over the same rows held in memory, members in one process under the daemons'
    keys (their seeds and ring order): the memory engine's results."""
    import asyncio

    from fedpeer.data.site import load_site
    from fedpeer.identity import parse_public_key
    from fedpeer.jobs.kind import JobContext
    from fedpeer.testing.memory import MemoryNetwork

    keys = [parse_public_key(s.public_key) for s in h.sites]
    names = {k: s.name for k, s in zip(keys, h.sites)}
    sites = []
    for k in range(len(h.sites)):
        data = cfg.DataSection(parquet=str(tmp_path / f"rows{k}" / "whole.parquet"), label="diagnosis",
                               positive="malignant", ignore=("id",))
        sites.append(load_site(data, cfg.JobLimits(), needs_label=True, binary=True)[0])
    checked = kind.check_params(params)

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0)
        return await asyncio.gather(*[kind.run(net.channel(k), checked, JobContext(names[k], names, 20_000, data=d))
                                      for k, d in zip(keys, sites)])
    return asyncio.run(go())


async def test_jobs_on_a_dask_site_equal_the_jobs_in_memory(make_federation, cluster, tmp_path: Path) -> None:
    import asyncio

    from fedpeer.kinds import stats as stats_kind

    h = make_federation(3, start=False)
    _attach(h, tmp_path, cluster.scheduler_address)
    h.start()
    await h.wait_all_alive(timeout_s=30)

    stats = {"bins": 8, "secure_sum": "pairwise"}
    got = await _run(h, 1, "stats", stats)
    assert {r["state"] for r in got.values()} == {"done"}, [r["error"] for r in got.values()]
    want = await asyncio.to_thread(_in_process, h, tmp_path, stats_kind.KIND, stats)
    for i in range(3):
        a, b = got[i]["result"], want[i]
        assert a["count"] == b["count"] == 569 and a["class_counts"] == b["class_counts"]
        assert [(v["below"], v["counts"], v["above"]) for v in a["histograms"].values()] == \
               [(v["below"], v["counts"], v["above"]) for v in b["histograms"].values()]
        assert np.allclose(list(a["mean"].values()), list(b["mean"].values()), rtol=1e-12, atol=0)
        assert np.allclose(list(a["std"].values()), list(b["std"].values()), rtol=1e-12, atol=0)

    # bofrf: the forest trained on a worker, every tree's matrix per partition: the memory engine's results
    from fedpeer.kinds.forest import bofrf as bofrf_kind

    forest = {"n_estimators": 5, "max_depth": 5, "secure_sum": "pairwise"}
    got = await _run(h, 1, "bofrf", forest)
    assert {r["state"] for r in got.values()} == {"done"}, [r["error"] for r in got.values()]
    want = await asyncio.to_thread(_in_process, h, tmp_path, bofrf_kind.KIND, forest)
    for i in range(3):
        a, b = got[i]["result"], want[i]
        for key in ("local_rf", "bofrf_local", "bofrf_global", "final", "tau", "rows", "trees_kept"):
            assert a[key] == b[key], (i, key, a[key], b[key])

    # a kind the engine lacks: refused by the dask site, named, before any cluster work
    records = await _run(h, 1, "bofrf", {"n_estimators": 5, "variant": "clustered"})
    assert {r["state"] for r in records.values()} == {"failed"}
    mine = records[0]["error"]
    assert mine.startswith("site-1: ") and 'engine = "dask" supports stats, bofrf (variant "base" or ' \
        '"personalized"' in mine and "not bofrf with variant = 'clustered'" in mine, mine

    # the scheduler unreachable: the job fails naming the site and the scheduler; the daemon serves on
    dead = "tcp://127.0.0.1:9"
    add_peers(h.sites[0].config_path, [], {"data": {"scheduler": dead, "dask_connect_timeout_ms": 1500}})
    await request(h.sites[0].config, "POST", "/v1/reload")
    records = await _run(h, 1, "stats", stats)
    assert {r["state"] for r in records.values()} == {"failed"}
    mine = records[0]["error"]
    assert mine.startswith("site-1: ") and f"[data] scheduler {dead}: cannot reach the Dask scheduler" in mine, mine
    assert h.sites[0].process.poll() is None and (await h.status(0))["node"]
