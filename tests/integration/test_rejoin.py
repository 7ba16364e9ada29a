"""A member of a running histogram XGBoost job stopped (TERM), then another killed (-9), and each
started again at once (issue 41): the survivors end done with one model, the restarted member
comes back into the job and ends with the same model (fedpeer/jobs/lifecycle/rejoin.py,
fedpeer/protocols/epochs.py "Rejoins"), and its record kept on disk where the job was when it
stopped. One federation, two runs (benchmarks/bench_restarts.py runs fourteen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedpeer.testing.restarts import restart_mid_job
from tests.integration.test_xgbhist import ALLREDUCE, _federation

pytestmark = pytest.mark.integration
# long enough that a member is back (its daemon starts in 1-5 s on a loaded machine, then loads
# its data) with trees left: ~6 trees a second here
PARAMS = {**ALLREDUCE, "max_depth": 2, "max_bin": 16, "rounds": 50}


async def test_a_restarted_member_rejoins_and_its_record_keeps_the_step(make_federation, tmp_path: Path) -> None:
    h, _, _ = await _federation(make_federation, tmp_path, 4, {"jobs": {"hop_timeout_ms": 5_000}})
    for victim, how in ((2, "term"), (1, "kill9")):
        run = await restart_mid_job(h, 0, victim, PARAMS, how, 2, timeout_s=60)
        assert run.survivors_done, (run.line(), run.errors)
        on_disk = run.on_disk     # the step seen over a second before it stopped is on disk (or a later one)
        assert 1 <= run.step_seen <= on_disk["progress"]["step"] < PARAMS["rounds"], run.line()
        if how == "term":         # stopped cleanly: interrupted where it was
            assert on_disk["state"] == "interrupted", run.line()
            assert (f"the daemon stopped at phase 'histogram mode: round {on_disk['progress']['step']} of "
                    f"{PARAMS['rounds']}', step {on_disk['progress']['step']}") in on_disk["error"], on_disk["error"]
        else:                     # killed: still "running" on disk; the restart marks it interrupted
            assert on_disk["state"] == "running", run.line()
        assert run.rejoined, run.line()
        assert run.victim is not None and run.victim["rejoins"] == 1
