"""A site whose xgboost job is done answers a member that missed the end (issue 12 item 3):
only while it leads, only from what it stored, and never with a model changed since."""

from __future__ import annotations

import json
from pathlib import Path

from fedpeer.jobs import xgboost as xgb
from fedpeer.jobs.base import Finished
from fedpeer.ml import boosting

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
