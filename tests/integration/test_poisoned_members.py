"""A member running a build patched to lie, against real daemons (issue 38, findings 2 and 10).

The attacker is site-3's daemon itself, started with a `sitecustomize` first on its PYTHONPATH
that changes what it computes — as a member who edits its own copy of fedpeer would. The honest
sites run this build unchanged and must end the job everywhere without adopting a model:
- finding 2: +2^62 on each of one tree's four BOFRF confusion counts (the int64 row sum wraps
  back to the honest total; before the exact-integer checks every site ended `done` with 0 of its
  trees kept);
- finding 10: histogram XGBoost gradients with their signs flipped (every cell within its bounds;
  before the root check, every site adopted a model whose held-out AUC fell from 0.999 to 0.884).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import split_csv
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

BOFRF_WRAP = '''
import numpy as np
import fedpeer.kinds.forest.bofrf as target
_real = target.secure_sum

async def _lying(ch, tag, vector, *args, **kw):
    if tag.endswith("confusion"):
        vector = np.array(vector, dtype=np.uint64, copy=True)
        vector[:4] += np.uint64(1 << 62)          # one tree's tp, tn, fp, fn: the row sum wraps to the truth
    return await _real(ch, tag, vector, *args, **kw)

target.secure_sum = _lying
'''

XGB_FLIP = '''
import fedpeer.ml.xgb.histrun as target
_real = target.HistSite.start_round

def _flipped(self):
    _real(self)
    g, h = self._derivs
    self._derivs = (-g, h)                        # every row's gradient, sign flipped

target.HistSite.start_round = _flipped
'''


async def _federation_with_a_liar(make_federation, tmp_path: Path, patch: str):
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=4, out_dir=tmp_path / "parts")
    h = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    lie = tmp_path / "liar"
    lie.mkdir()
    (lie / "sitecustomize.py").write_text(patch)
    h.sites[2].env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lie), str(ROOT)])}
    h.start()
    await h.wait_all_alive(timeout_s=30)
    return h


async def _fails_everywhere_without_a_model(h, job_id: str, what: str) -> None:
    records = await h.wait_job(job_id, timeout_s=180)
    honest = [records[0], records[1]]
    for r in honest:
        assert r["state"] == "failed", (r["state"], r.get("error"), r.get("result"))
        assert what in r["error"], r["error"]
        assert not (r.get("result") or {}).get("model_file"), "a poisoned model was kept"


async def test_a_member_wrapping_bofrf_confusion_counts_fails_the_job_everywhere(make_federation,
                                                                                 tmp_path: Path) -> None:
    h = await _federation_with_a_liar(make_federation, tmp_path, BOFRF_WRAP)
    job_id = await h.propose(0, "bofrf", {"n_estimators": 10, "max_depth": 3, "seed": 1})
    await _fails_everywhere_without_a_model(h, job_id, "confusion")


async def test_a_member_flipping_its_gradient_signs_fails_histogram_xgboost_everywhere(make_federation,
                                                                                        tmp_path: Path) -> None:
    h = await _federation_with_a_liar(make_federation, tmp_path, XGB_FLIP)
    job_id = await h.propose(0, "xgboost", {"rounds": 5, "max_depth": 3})
    await _fails_everywhere_without_a_model(h, job_id, "root gradient sum")


PSI_GREEDY_COLLECTOR = '''
import fedpeer.protocols.psi as target
_real = target._count

async def _greedy(ch, full, rows_min, sizes, wait_ms, tag):
    members = tuple(ch.members)
    if ch.me == members[0]:                     # the collector announces the last member's whole list
        victim = sorted(full[members[-1]])[:min(sizes.values())]
        full = {owner: victim for owner in full}
    return await _real(ch, full, rows_min, sizes, wait_ms, tag)

target._count = _greedy
'''


async def test_a_collector_announcing_another_members_whole_list_is_refused_before_any_unblinding(
        make_federation, tmp_path: Path) -> None:
    """Finding 1 against real daemons: the collector (the member whose key sorts first: a site can
    choose such a key) runs a build that announces, as the common points, the last member's whole
    fully blinded list (cut to the smallest member's size, so the count passes). Before, the
    members stripped their scalars from those points and the collector recovered IDs outside the
    intersection; now every other member checks the points against the lists it blinded last and
    refuses, naming the collector, before anyone removes a scalar."""
    from fedpeer.identity import parse_public_key
    from tests.integration.test_vertical import attach, write_blocks
    _, paths = write_blocks(tmp_path, seed=5)
    h = make_federation(3, start=False)
    attach(h.sites, paths, partition="vertical", id_column="ID")
    collector = min(range(3), key=lambda i: parse_public_key(h.sites[i].public_key))
    lie = tmp_path / "liar"
    lie.mkdir()
    (lie / "sitecustomize.py").write_text(PSI_GREEDY_COLLECTOR)
    h.sites[collector].env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lie), str(ROOT)])}
    h.start()
    await h.wait_all_alive(timeout_s=30)
    honest = [i for i in range(3) if i != collector]
    job_id = await h.propose(honest[0], "stats", {"bins": 8})
    records = await h.wait_job(job_id, timeout_s=120)
    for i in honest:
        r = records[i]
        assert r["state"] == "failed", (r["state"], r.get("result"))
        assert "announced common IDs that are not all in a list this site blinded last" in r["error"] or \
            "outside a list it blinded last" in r["error"], r["error"]
        assert not r.get("result"), r["result"]
