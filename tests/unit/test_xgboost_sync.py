"""A site whose xgboost job is done answers a member that missed the end (issue 12 item 3):
only while it leads, only from what it stored, and never with a model changed since."""

from __future__ import annotations

import json
from pathlib import Path

from fedpeer.jobs.kind import Finished
from fedpeer.kinds.xgboost import kind as xgb
from fedpeer.ml.xgb import boosting

ME, OTHER = b"m" * 32, b"o" * 32
MODEL = b'{"learner": "a stored model"}'


def stored(tmp_path: Path, model: bytes = MODEL) -> Path:
    sha = boosting.model_sha256(MODEL)
    (tmp_path / "xgb-round-12.json").write_bytes(model)
    (tmp_path / "xgb-commit.json").write_text(json.dumps({"term": 3, "round": 12, "model_sha256": sha,
                                                          "model_file": "xgb-round-12.json"}))
    (tmp_path / xgb.HISTORY_FILE).write_bytes(b'[{"round": 12}]')
    return tmp_path


def test_the_leader_answers_done_with_the_stored_model_under_its_current_term(tmp_path: Path) -> None:
    done = Finished(me=ME, members=(ME, OTHER), workdir=stored(tmp_path), leadership=(5, ME))
    answer = xgb.serve_done(done, OTHER, xgb.SyncAsk(tag=xgb.SYNC_TAG, round=4))
    assert answer is not None and answer.op == "done" and answer.term == 5 and answer.round == 12
    assert answer.model == MODEL and answer.sha == boosting.model_sha256(MODEL) and answer.commit_term == 3
    assert answer.history == b'[{"round": 12}]'


def test_no_answer_unless_leading_or_from_a_model_changed_since(tmp_path: Path) -> None:
    ask = xgb.SyncAsk(tag=xgb.SYNC_TAG, round=4)
    assert xgb.serve_done(Finished(ME, (ME, OTHER), stored(tmp_path), (5, OTHER)), OTHER, ask) is None
    assert xgb.serve_done(Finished(ME, (ME, OTHER), stored(tmp_path), (5, None)), OTHER, ask) is None
    tampered = stored(tmp_path, model=MODEL + b" ")
    assert xgb.serve_done(Finished(ME, (ME, OTHER), tampered, (5, ME)), OTHER, ask) is None


class _EvalChannel:
    """Just what a member's evaluation wait touches: the election (OTHER leads term 5), the
    failure detector (everyone alive), a clock and a mailbox of directives."""

    def __init__(self, directives: list) -> None:
        import asyncio

        self.job_id, self.me, self.members = "job", ME, (ME, OTHER)
        self.mailbox, self.sent, self.t0 = list(directives), [], asyncio.get_running_loop().time()

    def leadership(self) -> tuple[int, bytes]:
        return 5, OTHER

    def alive(self, peer: bytes) -> bool:
        return True

    def now_ms(self) -> int:
        import asyncio

        return int((asyncio.get_running_loop().time() - self.t0) * 1000) + 60_000

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 0) -> tuple:
        from fedpeer.runtime.channel import RecvTimeout

        if not self.mailbox:
            raise RecvTimeout("empty")
        return self.mailbox.pop(0)

    async def send(self, dst: bytes, msg: object) -> None:
        self.sent.append((dst, msg))


async def _evaluating(directives: list) -> tuple[xgb.Site, str, _EvalChannel]:
    """A member evaluating a round whose sum never ends (its other participants finished the job)."""
    import asyncio

    ch = _EvalChannel(directives)
    site = xgb.Site(ch=ch, params={}, ctx=None, tools=xgb.Tools())
    site.seen_term, site.silent_since_ms = 5, 0      # its last directive: a minute ago
    try:
        await asyncio.wait_for(site.while_alive(OTHER, asyncio.sleep(3600), term=5, ended=site.ended_at_leader),
                               3 * xgb.POLL_MS / 1000)
    except xgb._Died as exc:
        return site, str(exc), ch
    except TimeoutError:
        pass
    return site, "", ch


async def test_a_member_stuck_evaluating_asks_the_leader_and_stops_at_its_done() -> None:
    """Issue 12 item 3, the frozen member of the integration test: resumed, it evaluated a stale
    round with sites that had finished, and waited out the sum's patience (over a minute) before
    it asked the leader. Now it asks while it waits, and the leader's "done" ends the wait; the
    directive is held for the main loop to follow."""
    done = xgb._directive(5, "done", 12, sha="s", model=b"m", commit_term=3)
    site, why, ch = await _evaluating([(OTHER, done)])
    assert why == "the job ended at the leader"
    assert [type(m).__name__ for _, m in ch.sent] == ["SyncAsk"] and ch.sent[0][0] == OTHER
    assert site.held == [(OTHER, done)]


async def test_other_directives_are_held_without_ending_the_evaluation_and_forged_done_is_ignored() -> None:
    nxt = xgb._directive(5, "round", 13)
    forged = xgb._directive(5, "done", 12, sha="s", model=b"m", commit_term=3)
    site, why, _ = await _evaluating([(OTHER, nxt), (b"x" * 32, forged)])     # from a site that does not lead
    assert why == ""                       # not ended: the wait ran on (to the test's own timeout)
    assert [m.op for _, m in site.held] == ["round", "done"]
