"""`fedpeer run KIND --param NAME=VALUE` beside the typed flags (one way to pass parameters), the
kind's own usage and the nearest names for an option it does not take, and no abbreviations."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fedpeer.app import cli
from fedpeer.app.sitefiles import init_site


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return init_site(tmp_path / "a", "a", "127.0.0.1:17401")[0]


@pytest.fixture
def proposed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `run` would send the daemon (no daemon runs)."""
    sent: list[dict[str, Any]] = []

    def ask(config: Any, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
        sent.append(payload)
        return {"id": "job-1"}

    monkeypatch.setattr(cli, "_ask", ask)
    return sent


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_param_is_typed_as_its_flag_and_the_rest_keep_their_defaults(site: Path, proposed: list) -> None:
    assert cli.main(["run", "xgboost", "--config", str(site), "--param", "mode=bagging", "--param", "eta=0.1",
                     "--max-depth", "3"]) == 0
    params = proposed[0]["params"]
    assert params["mode"] == "bagging" and params["eta"] == 0.1 and isinstance(params["eta"], float)
    assert params["max_depth"] == 3 and params["rounds"] == 20


def test_param_and_flag_give_the_same_job(site: Path, proposed: list) -> None:
    cli.main(["run", "tree", "--config", str(site), "--param", "mode=icdta", "--param", "max-depth=3"])
    cli.main(["run", "tree", "--config", str(site), "--mode", "icdta", "--max-depth", "3"])
    assert proposed[0] == proposed[1]


def test_a_param_given_both_ways_is_an_error_naming_both(site: Path, proposed: list,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["run", "xgboost", "--config", str(site), "--param", "eta=0.1", "--eta", "0.2"], capsys)
    assert "--param eta=" in err and "--eta" in err and proposed == []


@pytest.mark.parametrize("pair, words", [("mode=foo", ["invalid choice", "histogram"]),
                                         ("eta=abc", ["invalid float"]),
                                         ("learning_rate=0.1", ["did you mean --eta?"]),
                                         ("eta", ["NAME=VALUE"])])
def test_a_bad_param_is_a_usage_error_of_the_kind(site: Path, proposed: list, pair: str, words: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["run", "xgboost", "--config", str(site), "--param", pair], capsys)
    assert "usage: fedpeer run xgboost" in err and all(w in err for w in words) and proposed == []


def test_a_param_out_of_range_is_refused_as_its_flag_is(site: Path, proposed: list,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "xgboost", "--config", str(site), "--param", "eta=2"]) == 2
    assert "eta" in capsys.readouterr().err and proposed == []


def test_an_unknown_run_option_prints_the_kinds_usage_and_the_nearest_name(
        site: Path, proposed: list, capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["run", "xgboost", "--config", str(site), "--learning-rate", "0.1"], capsys)
    assert err.startswith("usage: fedpeer run xgboost") and "did you mean --eta?" in err and proposed == []


def test_an_abbreviated_option_is_never_taken_for_the_full_one(site: Path, proposed: list,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["run", "xgboost", "--config", str(site), "--round", "5"], capsys)
    assert "did you mean --rounds?" in err and proposed == []
    usage_error(["ping", "--config", str(site), "b", "--coun", "3"], capsys)


def test_no_parser_allows_abbreviations() -> None:
    def parsers(p: argparse.ArgumentParser):
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    found = list(parsers(cli._parser([])))
    assert len(found) > 20 and [p.prog for p in found if p.allow_abbrev] == []
