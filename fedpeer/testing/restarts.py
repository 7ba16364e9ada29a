"""Issue 41's restart test over real daemons (the harness, fedpeer/app/harness/federation.py): one
member of a running histogram XGBoost job stopped (TERM) or killed (-9) and started again at
once; how the job ended at the survivors, whether the restarted member came back into it
(fedpeer/jobs/lifecycle/rejoin.py), and what its record kept on disk of where it stopped.
tests/integration/test_rejoin.py runs it twice, benchmarks/bench_restarts.py fourteen times."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from fedpeer.jobs.records import PROGRESS_SAVE_INTERVAL_MS

HOWS = ("term", "kill9")


@dataclass(frozen=True)
class RestartRun:
    how: str                        # "term" or "kill9"
    step_seen: int                  # the victim's step a little over a second before it stopped, from its API
    on_disk: dict                   # its record file as the restarted daemon found it
    survivors_done: bool            # every survivor done, with one model
    rejoined: bool                  # the victim done too, with the survivors' model, listed as rejoined
    victim: dict | None             # the victim's record at the end
    errors: tuple[str, ...]         # the survivors' errors, if any

    def line(self) -> str:
        v = self.victim or {}
        why = v.get("error") or ""
        return (f"{self.how}: step {self.step_seen} seen, on disk {self.on_disk.get('state')} at step "
                f"{self.on_disk.get('progress', {}).get('step')}; survivors "
                f"{'done' if self.survivors_done else 'NOT done'}; restarted member "
                f"{'rejoined' if self.rejoined else v.get('state')}{': ' + why if why else ''}")


async def restart_mid_job(h: Any, proposer: int, victim: int, params: dict, how: str, step: int,
                          timeout_s: float = 120.0) -> RestartRun:
    """Propose a histogram job at `proposer`, stop or kill `victim` a little over a second after
    its record shows `step` (its progress is on disk by then: records.PROGRESS_SAVE_INTERVAL_MS),
    start it again at once, and wait for every member's record to end."""
    assert how in HOWS
    job_id = await h.propose(proposer, "xgboost", params)
    await h.wait_step(victim, job_id, step, timeout_s=timeout_s)
    record = await h.job(victim, job_id)
    seen = record["progress"]["step"] if record else -1
    await asyncio.sleep(PROGRESS_SAVE_INTERVAL_MS / 1000 + 0.2)
    if how == "kill9":
        h.kill9(victim)
    else:
        h.stop(victim)
    path = h.sites[victim].config.node.state_dir / "jobs" / job_id / "job.json"
    on_disk = json.loads(path.read_text())
    h.start(victim)
    records = await h.wait_job(job_id, timeout_s=timeout_s)
    survivors = [records[i] for i in range(h.n_sites) if i != victim]
    done = all(r is not None and r["state"] == "done" for r in survivors)
    shas = {r["result"]["model_sha256"] for r in survivors if r is not None and r["state"] == "done"}
    mine = records[victim]
    name = h.sites[victim].name
    rejoined = (done and len(shas) == 1 and mine is not None and mine["state"] == "done"
                and mine["result"]["model_sha256"] in shas and name in mine["result"].get("rejoined", []))
    errors = tuple(r["error"] for r in survivors if r is not None and r.get("error"))
    return RestartRun(how, seen, on_disk, done and len(shas) == 1, rejoined, mine, errors)
