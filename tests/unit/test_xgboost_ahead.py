"""A bagging member's work done ahead of the leader (fedpeer/kinds/xgboost/training.py, site.py):
the next round's trees started once a round is committed, the test_csv score started once the
last round is; and what a member stores of its rounds (at most once a second, the last fsynced)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_classification

from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint
from fedpeer.jobs.kind import JobContext, site_seed
from fedpeer.kinds.xgboost import kind as xj
from fedpeer.kinds.xgboost.messages import STORE_EVERY_MS
from fedpeer.kinds.xgboost.target import model_score
from fedpeer.ml.xgb import boosting

ME = b"\x01" * 32


class Ch:
    me, members, job_id = ME, (ME, b"\x02" * 32), "j1"
    clock_ms = 0

    def progress(self, *args: Any, **kw: Any) -> None:
        pass

    def now_ms(self) -> int:
        return self.clock_ms


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def site(tmp_path, rounds: int = 3, test_data: Any = None, **over: Any) -> xj.Site:
    X, y = make_classification(n_samples=300, n_features=4, random_state=3)
    p = xj.KIND.check_params({"mode": "bagging", "rounds": rounds, "nthread": 1, "max_depth": 3, **over})
    s = xj.Site(ch=Ch(), params=p, ctx=JobContext("a", {}, 1000, test_data=test_data, workdir=tmp_path),
                tools=xj.Tools(offload=inline))
    s.fit = s.test = (X, y)
    s.base, s.total_rows = boosting.global_base_score(int(y.sum()), len(y), "binary:logistic"), 2 * len(y)
    s.adopt(0, 0, None)
    return s


def plain_trees(s: xj.Site, model: bytes | None, rnd: int, eta: float) -> bytes:
    """The trees of round `rnd` as any member trains them: no cache, no head start."""
    params = {**xj.train_params(s.params), "base_score": s.base}
    seed = (site_seed(s.params["seed"], ME) + rnd) % 2**31
    return boosting.train_local_round(model, s.fit[0], s.fit[1], params, s.params["num_local_round"], eta, seed)


def commit_round(s: xj.Site, rnd: int, other: bytes) -> bytes:
    """Round `rnd`: this site's trees and another member's, appended; stored as committed."""
    mine, _ = asyncio.run(s.local_trees(rnd, -1.0))
    s.adopt(1, rnd, s.build([mine, other]))
    return mine


def test_trees_started_ahead_are_the_ones_the_directive_asks_for(tmp_path):
    s = site(tmp_path)
    other = plain_trees(s, None, 1, 0.1)
    assert commit_round(s, 1, other) == plain_trees(s, None, 1, 0.3)
    model = s.model

    async def ahead_then_asked() -> tuple[bytes, str]:
        s.train_ahead(None)
        assert s.ahead is not None and s.ahead[0] == (2, s.commit[2], 0.3)
        return await s.local_trees(2, -1.0)

    assert asyncio.run(ahead_then_asked()) == (plain_trees(s, model, 2, 0.3), "") and s.ahead is None

    async def ahead_then_another_model() -> tuple[bytes, str]:
        s.train_ahead(None)                          # on round 1's model...
        s.adopt(2, 1, s.build([other]))               # ...then a new leader's round 1
        return await s.local_trees(2, -1.0)

    assert asyncio.run(ahead_then_another_model()) == (plain_trees(s, s.model, 2, 0.3), "")
    asyncio.run(s.stored())


def test_a_member_whose_rate_comes_with_the_directive_waits_for_it(tmp_path):
    s = site(tmp_path, normalize="gain")
    commit_round(s, 1, plain_trees(s, None, 1, 0.1))

    async def go() -> None:
        s.train_ahead(None)
        assert s.ahead is None                                   # a member: the leader's share decides
        s.train_ahead(0.5)                                       # the leader knows its own share
        assert s.ahead is not None and s.ahead[0][2] == 0.15
        s.drop_ahead()
        s.adopt(1, 3, s.model)                                   # the last round: nothing after it
        s.train_ahead(0.5)
        assert s.ahead is None
        await s.stored()

    asyncio.run(go())


def test_rounds_are_stored_at_most_once_a_second_and_the_last_one_fsynced(tmp_path, monkeypatch):
    s = site(tmp_path, rounds=5)
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))

    def stored() -> tuple[int, bytes]:
        s._writer.submit(lambda: None).result()           # the writes so far have landed (one thread, in order)
        commit = json.loads((tmp_path / "xgb-commit.json").read_bytes())
        return commit["round"], (tmp_path / commit["model_file"]).read_bytes()

    commit_round(s, 1, plain_trees(s, None, 1, 0.1))
    assert stored() == (1, s.model) and synced == []          # the first round: on disk, not fsynced
    first = s.model
    s.ch.clock_ms = STORE_EVERY_MS - 1
    commit_round(s, 2, plain_trees(s, s.model, 2, 0.1))
    assert stored() == (1, first)                              # within a second of the last: not written
    s.ch.clock_ms = STORE_EVERY_MS
    commit_round(s, 3, plain_trees(s, s.model, 3, 0.1))
    assert stored() == (3, s.model) and synced == []
    commit_round(s, 4, plain_trees(s, s.model, 4, 0.1))
    commit_round(s, 5, plain_trees(s, s.model, 5, 0.1))
    assert stored() == (5, s.model)                            # the last round, whatever the clock
    assert len(synced) == 4           # model file and its directory, commit record and its directory
    asyncio.run(s.stored())           # the job's end: the history too
    assert len(synced) == 6
    assert sorted(p.name for p in tmp_path.glob("xgb-*")) == ["xgb-commit.json", "xgb-history.json",
                                                              "xgb-round-5.json"]
    asyncio.run(s.close())


def test_the_test_csv_score_starts_when_the_last_round_is_stored(tmp_path):
    X, y = make_classification(n_samples=120, n_features=4, random_state=5)
    labels = np.where(y == 1, "p", "n")
    data = Dataset(("a", "b", "c", "d"), X, y.astype(np.int8), labels, 0,
                   schema_fingerprint(("a", "b", "c", "d"), [FEATURE_TYPE_FLOAT] * 4))

    async def go() -> tuple[Any, dict | None]:
        s = site(tmp_path, rounds=1, test_data=data)
        await asyncio.sleep(0)
        assert s.scoring is None
        mine, _ = await s.local_trees(1, -1.0)
        s.adopt(1, 1, s.build([mine]))
        assert s.scoring is not None and s.scoring[0] == s.commit[2]
        score = await s.test_score()
        await s.stored()
        return s, score

    s, score = asyncio.run(go())
    assert score == model_score(s.model, X, y.astype(np.int64), s.params, 1)


def test_a_last_round_that_cannot_be_written_fails_the_site_not_the_record(tmp_path, monkeypatch):
    """The last round's files are what serve_done hands a member that missed the end: if they
    cannot be written, this site's part of the job fails (naming the fix, not the path), while
    a failed write of a round in between is only logged."""
    import fedpeer.kinds.xgboost.site as site_module
    from fedpeer.errors import JobError

    s = site(tmp_path, rounds=2)
    real = site_module.atomic_write
    full = {"on": False}

    def atomic_write(path, data, *args, **kwargs):
        if full["on"]:
            raise OSError(28, "No space left on device", str(path))
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(site_module, "atomic_write", atomic_write)
    full["on"] = True
    commit_round(s, 1, plain_trees(s, None, 1, 0.1))          # in between: logged, the job goes on
    full["on"] = False
    commit_round(s, 2, plain_trees(s, s.model, 2, 0.1))
    asyncio.run(s.stored())
    assert json.loads((tmp_path / "xgb-commit.json").read_bytes())["round"] == 2
    full["on"] = True
    s2 = site(tmp_path / "again", rounds=1)
    commit_round(s2, 1, plain_trees(s2, None, 1, 0.1))
    with pytest.raises(JobError, match="free space") as failed:
        asyncio.run(s2.stored())
    assert str(tmp_path) not in str(failed.value)
    asyncio.run(s.close())
    asyncio.run(s2.close())


def test_a_commit_ack_carries_the_head_starts_trees_unless_another_model_came_meanwhile(tmp_path):
    """`ack_commit`: the next round's trees on the model just committed ride on the acknowledgement;
    if another model is adopted while they train (a new leader's round), the ack carries none."""
    s = site(tmp_path, rounds=3)
    other = plain_trees(s, None, 1, 0.1)
    commit_round(s, 1, other)
    sent = []
    s.reply = lambda leader, msg, **kw: sent.append((s.commit, kw.get("trees", b"")))

    async def go() -> None:
        s.train_ahead(None)
        s.ack_commit(b"L", xj._directive(1, "commit", 1, sha=s.commit[2]))
        s.adopt(2, 1, s.build([other]))          # another leader's round 1, while the head start trains
        await asyncio.gather(*list(s._replies))
        s.train_ahead(None)
        s.ack_commit(b"L", xj._directive(2, "commit", 1, sha=s.commit[2]))
        await asyncio.gather(*list(s._replies))
        await s.close()
    asyncio.run(go())
    assert sent[0][1] == b"" and sent[0][0][0] == 2
    assert sent[1][1] == plain_trees(s, s.model, 2, 0.3)


def test_the_leader_takes_offered_trees_only_for_the_round_and_model_they_were_trained_for(tmp_path):
    from fedpeer.kinds.xgboost.lead import offers_in

    def ack(rnd: int, sha: str, trees: bytes = b"t", error: str = "") -> xj.Reply:
        return xj.Reply(tag="", commit_term=1, commit_round=rnd, commit_sha=sha, trees=trees, model=b"",
                        history=b"", error=error)
    a, b, c, d, e = (bytes([i]) * 32 for i in range(1, 6))
    offered = offers_in([a, b, c, d, e], [ack(3, "s3"), ack(2, "s2"), ack(3, "other"), ack(3, "s3", b""),
                                          ack(3, "s3", error="need_model")], 3, "s3")
    assert offered == {a: (4, "s3", b"t")}      # another round, another model, no trees, an error: none
    s = site(tmp_path, rounds=5)
    assert s.offer_for(offered, a, 4, "s3") == b"t"
    assert s.offer_for(offered, a, 4, "s2") is None and s.offer_for(offered, a, 5, "s3") is None
    assert s.offer_for(offered, b, 4, "s3") is None
    gain = site(tmp_path, rounds=5, normalize="gain")
    assert gain.offer_for(offered, a, 4, "s3") is None
