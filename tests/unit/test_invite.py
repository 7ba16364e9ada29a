"""Setting sites up in few steps: `fedpeer invite` / `peer add --invite` (fedpeer/app/invite.py) and
`fedpeer init --data --label` (fedpeer/app/sitefiles.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from fedpeer.app import cli, invite
from fedpeer.app.sitefiles import init_site
from fedpeer.config import load as cfg
from fedpeer.identity import Identity, encode_public_key, fingerprint


def test_an_invite_round_trips_and_is_one_line() -> None:
    key = Identity.generate().public_key
    line = invite.make("lab-b", "lab-b.example:7400", key)
    assert line.startswith("fedpeer-invite:v1:") and "\n" not in line and " " not in line
    got = invite.parse(f"  '{line}'\n")
    assert (got.name, got.address, got.key, got.fingerprint) == ("lab-b", "lab-b.example:7400", key, fingerprint(key))


def _forge(doc: dict, version: str = "v1") -> str:
    body = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")
    return f"fedpeer-invite:{version}:{body}"


@pytest.mark.parametrize("change, expected", [
    ({"fingerprint": "0000-0000-0000-0000"}, "says fingerprint 0000-0000-0000-0000 but its key's is"),
    ({"public_key": "AAAA"}, "is damaged"),
    ({"address": "no-port"}, "is damaged: bad address"),
    ({"name": ""}, "1 to 200 characters"),
    ({"extra": "x"}, "expected the text fields"),
])
def test_a_changed_invite_is_refused(change: dict, expected: str) -> None:
    key = Identity.generate().public_key
    doc = {"name": "b", "address": "h:1", "public_key": encode_public_key(key), "fingerprint": fingerprint(key),
           **change}
    with pytest.raises(ValueError, match=expected):
        invite.parse(_forge(doc))
    with pytest.raises(ValueError, match="version 'v2'"):
        invite.parse(_forge(doc, "v2"))
    with pytest.raises(ValueError, match="must start with"):
        invite.parse(encode_public_key(key))


def test_four_sites_each_run_one_command_with_every_invite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every site runs the same `peer add` with all four invites: its own is passed over, a second
    run changes nothing, and the files are what `peer add --name --address --public-key` writes."""
    names = ["a", "b", "c", "d"]
    paths = [init_site(tmp_path / n, n, f"127.0.0.1:{17420 + i}")[0] for i, n in enumerate(names)]
    lines = []
    for path in paths:
        assert cli.main(["invite", "--config", str(path)]) == 0
        lines.append(capsys.readouterr().out.strip())
    command = [a for line in lines for a in ("--invite", line)]
    for path in paths:
        assert cli.main(["peer", "add", "--config", str(path), *command]) == 0
    out = capsys.readouterr().out
    assert out.count("added peer") == 12 and out.count("is this site: passed over") == 4
    for i, path in enumerate(paths):
        config = cfg.load(path)
        assert sorted(p.name for p in config.peers) == sorted(set(names) - {names[i]})
        assert {str(p.address) for p in config.peers} == {f"127.0.0.1:{17420 + j}" for j in range(4) if j != i}
    before = paths[0].read_text()
    assert cli.main(["peer", "add", "--config", str(paths[0]), *command]) == 0
    assert paths[0].read_text() == before and capsys.readouterr().out.count("is already listed") == 3
    by_hand = init_site(tmp_path / "by-hand", "a", "127.0.0.1:17420")[0]
    key_b = encode_public_key(next(p for p in cfg.load(paths[0]).peers if p.name == "b").public_key)
    assert cli.main(["peer", "add", "--config", str(by_hand), "--name", "b", "--address", "127.0.0.1:17421",
                     "--public-key", key_b]) == 0

    def table_of_b(path: Path) -> str:
        text = path.read_text()
        return text[text.index('\n[[peer]]\nname = "b"'):].split("\n\n")[0].strip()
    assert table_of_b(by_hand) == table_of_b(paths[0])


def test_peer_add_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = init_site(tmp_path / "a", "a", "127.0.0.1:17430")[0]
    assert cli.main(["peer", "add", "--config", str(path), "--name", "b"]) == 2
    assert "missing: --address, --public-key" in capsys.readouterr().err
    line = invite.make("b", "127.0.0.1:17431", Identity.generate().public_key)
    assert cli.main(["peer", "add", "--config", str(path), "--invite", line, "--name", "x"]) == 2
    assert cli.main(["peer", "add", "--config", str(path), "--invite", line[:-6]]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[1].startswith("fedpeer peer add: --invite: ")
    assert cfg.load(path).peers == ()


def test_init_with_data_writes_the_data_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "cohort.csv"
    data.write_text("Id, age ,Class\n1,50,M\n2,60,B\n")
    assert cli.main(["init", "--dir", str(tmp_path / "a"), "--name", "a", "--listen", "127.0.0.1:17440",
                     "--data", str(data), "--label", "Class", "--positive", "M"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("fedpeer-invite:v1:")
    section = cfg.load(tmp_path / "a" / "peers.toml").data
    assert (section.csv, section.label, section.positive) == (str(data), "Class", "M")
    assert cli.main(["init", "--dir", str(tmp_path / "b"), "--name", "b", "--listen", "127.0.0.1:17441",
                     "--data", str(data), "--label", "class"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "data.label: " in err and "label column 'class' not found" in err
    assert "did you mean 'Class'?" in err and "'age'" in err
    assert cli.main(["init", "--dir", str(tmp_path / "b"), "--name", "b", "--listen", "127.0.0.1:17441",
                     "--data", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv: file not found" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert cli.main(["init", "--dir", str(tmp_path / "b"), "--name", "b", "--listen", "127.0.0.1:17441",
                     "--label", "Class"]) == 2
    assert not (tmp_path / "b").exists()


def init(tmp_path: Path, name: str, data: Path, *flags: str) -> int:
    return cli.main(["init", "--dir", str(tmp_path / name), "--name", name, "--listen", "127.0.0.1:17442",
                     "--data", str(data), *flags])


@pytest.fixture
def wide(tmp_path: Path) -> Path:
    """A CSV of 30 feature columns, an ID and a label (diagnosis: malignant / benign)."""
    header = ["patient_id", *(f"feature_{i:02d}" for i in range(30)), "diagnosis"]
    rows = [",".join(header)] + [",".join([f"p{r}", *(str(r + i) for i in range(30)),
                                           "malignant" if r % 2 else "benign"]) for r in range(6)]
    path = tmp_path / "wide.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_init_writes_ignore_id_column_and_partition_into_data(tmp_path: Path, wide: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert init(tmp_path, "h", wide, "--label", "diagnosis", "--positive", "malignant", "--ignore", "patient_id",
                "--ignore", "feature_29", "--partition", "horizontal") == 0
    section = cfg.load(tmp_path / "h" / "peers.toml").data
    assert (section.ignore, section.partition, section.positive) == (("patient_id", "feature_29"), "horizontal",
                                                                     "malignant")
    assert init(tmp_path, "v", wide, "--label", "diagnosis", "--partition", "vertical", "--id-column",
                "patient_id") == 0
    section = cfg.load(tmp_path / "v" / "peers.toml").data
    assert (section.partition, section.id_column) == ("vertical", "patient_id")
    capsys.readouterr()


@pytest.mark.parametrize("flags, key, words", [
    (["--label", "Diagnosis"], "data.label", ["did you mean 'diagnosis'?", "'feature_25'", "'diagnosis'"]),
    (["--label", "diagnosis", "--ignore", "patient-id"], "data.ignore", ["did you mean 'patient_id'?"]),
    (["--label", "diagnosis", "--partition", "vertical", "--id-column", "id"], "data.id_column", ["'patient_id'"]),
    (["--label", "diagnosis", "--id-column", "patient_id"], "data.id_column", ['partition = "vertical"']),
    (["--label", "diagnosis", "--positive", "M"], "data.positive", ["'benign', 'malignant'"]),
])
def test_init_checks_every_column_it_writes_and_lists_every_column(
        tmp_path: Path, wide: Path, flags: list[str], key: str, words: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    assert init(tmp_path, "x", wide, *flags) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{key}: " in err and all(w in err for w in words), err
    assert "..." not in err and not (tmp_path / "x").exists()


def test_init_without_data_refuses_the_data_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["init", "--dir", str(tmp_path / "a"), "--name", "a", "--listen", "127.0.0.1:17443",
                     "--ignore", "Id"]) == 2
    assert "go with --data" in capsys.readouterr().err and not (tmp_path / "a").exists()
