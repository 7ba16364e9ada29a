"""The command line's contract with its users: --version, help on every option, and exit code 2
only for configuration and usage errors (the README's table) — found before any daemon is asked
or started, because systemd does not restart after 2 and operators read it as "fix what you typed".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedpeer.app import cli
from fedpeer.app.sitefiles import init_site
from fedpeer.base import build


def walk(parser: argparse.ArgumentParser, path: str = "fedpeer"):
    """(command path, action) for every argument of every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", argparse.Action([name], name, help=helped.get(name))
                yield from walk(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_and_subcommand_has_help() -> None:
    actions = list(walk(cli._parser([])))      # [] : the full parser, every job kind included
    missing = [f"{path}: {'/'.join(a.option_strings) or a.dest}" for path, a in actions
               if not a.help or a.help == argparse.SUPPRESS]
    assert len(actions) > 100, "the walk reaches every subcommand, job kinds and harness included"
    assert missing == []


def test_version_prints_this_builds_version_and_commit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"fedpeer {build.SOFTWARE_VERSION} (commit {build.commit()})\n"


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return init_site(tmp_path / "a", "a", "127.0.0.1:17401")[0]


def test_a_job_parameter_out_of_range_is_a_usage_error_before_any_daemon_is_asked(
        site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No daemon runs: before, this was exit 3 ("no daemon"), and 1 once one ran.
    assert cli.main(["run", "stats", "--config", str(site), "--bins", "0"]) == 2
    err = capsys.readouterr().err
    assert "bins" in err and "0" in err and len(err.splitlines()) == 1


def test_a_ping_count_below_one_is_a_usage_error(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["ping", "--config", str(site), "b", "--count", "0"])
    assert exit_.value.code == 2 and "--count" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--split", "0.5,0.6"], ["--split", "0.5,x"], ["--param", "bins=0"],
                                 ["--param", "bins=many"], ["--param", "nope=1"]])
def test_harness_usage_errors_exit_2_before_any_daemon_starts(tmp_path: Path, bad: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "work"
    code = cli.main(["harness", "--sites", "2", "--job", "stats", "--data", "builtin:sonar",
                     "--workdir", str(workdir), *bad])
    assert code == 2
    assert not workdir.exists(), "nothing was set up, let alone started"
    assert capsys.readouterr().err.startswith("fedpeer harness: ")


def test_a_failure_that_is_not_the_users_input_is_not_exit_2(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["predict", "--config", str(site), "--job", "stats-none", "--data", str(site)]) == 1
    assert cli.main(["status", "--config", str(site)]) == 3
    assert "no job 'stats-none'" in capsys.readouterr().err


def test_commands_other_than_run_and_harness_do_not_import_the_job_modules() -> None:
    """`fedpeer status` and the like build no job kind's parser: no numpy, no job modules (~0.4 s
    per call); they parse exactly as with the full parser."""
    import subprocess
    import sys

    code = ("import sys; from fedpeer.app import cli; "
            "a = cli._parser(['status', '--config', 'x']).parse_args(['status', '--config', 'x']); "
            "print(sorted(m for m in sys.modules if m.startswith('fedpeer.kinds.') and m != 'fedpeer.kinds.catalog'), "
            "'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] False", out
    for argv in (["jobs", "--config", "x", "--json"], ["job", "show", "j1", "--config", "x"],
                 ["status", "--config", "x"], ["peer", "list", "--config", "x"]):
        assert vars(cli._parser(argv).parse_args(argv)) == vars(cli._parser([]).parse_args(argv)), argv


HEAVY = ("numpy", "sklearn", "xgboost", "aiohttp", "pyarrow", "cryptography", "fedpeer.kinds.catalog")


@pytest.mark.parametrize("argv", [["--version"], ["status", "--config", "SITE"],
                                  ["status", "--config", "SITE", "--json"]])
def test_version_and_status_import_nothing_heavy(site: Path, argv: list[str]) -> None:
    """`fedpeer --version` and `fedpeer status` start fast because they import no training library,
    no aiohttp (the admin client is plain asyncio) and no job kind: checked structurally, from
    sys.modules after the command ran in a fresh interpreter (no daemon runs: status exits 3)."""
    import subprocess
    import sys

    argv = [str(site) if a == "SITE" else a for a in argv]
    code = (f"import sys\nfrom fedpeer.app import cli\ntry:\n    code = cli.main({argv!r})\nexcept SystemExit as e:\n"
            f"    code = e.code\nprint(code, sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    expected = 0 if argv == ["--version"] else 3
    assert out.strip().splitlines()[-1] == f"{expected} []", out


def test_config_is_found_without_config_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--config, else $FEDPEER_CONFIG, else ./peers.toml, else /etc/fedpeer/peers.toml; none: exit 2, one line."""
    from fedpeer.config import locate

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(locate.CONFIG_ENV, raising=False)
    monkeypatch.setattr(locate, "DEFAULT_PLACES", (Path("peers.toml"), tmp_path / "etc" / "peers.toml"))
    assert cli.main(["peer", "list"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "FEDPEER_CONFIG" in err and "./peers.toml" in err, err
    etc, _ = init_site(tmp_path / "etc", "e", "127.0.0.1:17411")
    here, _ = init_site(tmp_path / "here", "h", "127.0.0.1:17412")
    env, _ = init_site(tmp_path / "env", "v", "127.0.0.1:17413")
    assert locate.find(None) == etc
    (tmp_path / "peers.toml").symlink_to(here)
    assert locate.find(None) == Path("peers.toml")
    monkeypatch.setenv(locate.CONFIG_ENV, str(env))
    assert locate.find(None) == env
    assert locate.find(etc) == etc
    assert cli.main(["invite"]) == 0 and capsys.readouterr().out.startswith("fedpeer-invite:v1:")
    monkeypatch.setenv(locate.CONFIG_ENV, str(tmp_path / "nope.toml"))   # named: used, and its error names it
    assert cli.main(["peer", "list"]) == 2 and "nope.toml: file not found" in capsys.readouterr().err
