"""A member's data error reaches the other sites without its path, cell values, row numbers or
counts (errors.DataError.public): what failed, at which site, which column or setting, and the fix.
The failing site's own record keeps every detail for its operator. Real daemons, read from the
proposer's and the other member's side, one case per kind of data error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import split_csv
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration
SECRET = "ICU-ward-7"          # a cell value no other site may see


def _corrupt(path: Path, case: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[3].split(",")
    if case == "text_cell":
        row[2] = SECRET
    elif case == "missing_value":
        row[2] = ""
    elif case == "short_row":
        row = row[:-2]
    lines[3] = ",".join(row)
    if case == "duplicate_column":
        header[2] = header[1]
        lines[0] = ",".join(header)
    path.write_text("\n".join(lines) + "\n")


CASES = {
    # case: (what the others must read, what the failing site's own record says besides)
    "text_cell": ("not a number", SECRET),
    "missing_value": ("missing or infinite values", "data row 3"),
    "short_row": ("another number of fields than the header", "data row 3"),
    "duplicate_column": ("appears twice", "columns 2 and 3"),
    "no_label": ("no label column 'diagnosis'", "the columns are"),
    "unreadable": ("cannot be read", "data.csv"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_members_data_error_tells_the_others_nothing_private(make_federation, tmp_path: Path,
                                                                     case: str) -> None:
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=3, out_dir=tmp_path / "parts")
    h = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    bad = h.sites[1].dir / "data.csv"
    if case == "no_label":
        bad.write_text(bad.read_text().replace("diagnosis", "outcome", 1))
    elif case == "unreadable":
        bad.unlink()
    else:
        _corrupt(bad, case)
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    public, private = CASES[case]
    assert {r["state"] for r in records.values()} == {"failed"}, records
    for i in (0, 2):                       # the proposer and the other member
        error = records[i]["error"]
        assert error.startswith(f"{h.sites[1].name}: ") and public in error, error
        assert str(h.sites[1].dir) not in error and "data.csv" not in error and SECRET not in error, error
        assert not re.search(r"\brow \d|\bline \d|\d+ of \d+|\(\d+ rows?\)", error), error
    mine = records[1]["error"]
    assert private in mine, mine           # the site's own operator sees the details
