"""A site without the optional extras (pyproject.toml: parquet, sql, dask) still reads CSV, with the
same result, and every source that needs a missing extra fails alone with one line naming it.

Each case runs in a subprocess where importing pyarrow, psycopg and distributed fails, as on a site
that installed fedpeer without extras.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.site import load_site

WITHOUT_EXTRAS = "import sys\nfor m in ('pyarrow', 'psycopg', 'distributed'):\n    sys.modules[m] = None\n"


def run_without_extras(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD = """
import json
from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.site import load_site
from fedpeer.errors import DataError
try:
    ds, _ = load_site(DataSection(**{section}), JobLimits(), needs_label=True, binary=True)
    print(json.dumps({{"rows": int(ds.X.shape[0]), "fingerprint": ds.fingerprint.hex(), "sum": float(ds.X.sum()),
                      "pyarrow": "pyarrow" in sys.modules and sys.modules["pyarrow"] is not None}}))
except DataError as e:
    print(json.dumps({{"error": str(e), "public": e.public}}))
"""


def test_csv_reads_the_same_without_pyarrow(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("Id,a,b,Class\n" + "".join(f"{i},{i * 0.5},{i % 3},{'MR'[i % 2]}\n" for i in range(50)))
    section = {"csv": str(path), "label": "Class", "positive": "M", "ignore": ("Id",)}
    with_arrow, _ = load_site(DataSection(**section), JobLimits(), needs_label=True, binary=True)
    without = run_without_extras(LOAD.format(section=repr(section)))
    assert without == {"rows": 50, "fingerprint": with_arrow.fingerprint.hex(), "sum": float(with_arrow.X.sum()),
                       "pyarrow": False}


@pytest.mark.parametrize("source, extra", [
    ({"parquet": "cohort.parquet"}, "parquet"),
    ({"sql": "SELECT a, y FROM t", "dsn_file": "cohort.dsn"}, "sql"),
    ({"engine": "dask", "scheduler": "local", "csv": "parts/*.csv"}, "dask"),
])
def test_a_source_whose_extra_is_missing_fails_naming_the_extra(tmp_path: Path, source: dict, extra: str) -> None:
    section = {**{k: str(tmp_path / v) if k in ("parquet", "dsn_file", "csv") else v for k, v in source.items()},
               "label": "y", "positive": "1"}
    doc = run_without_extras(LOAD.format(section=repr(section)))
    hint = f"pip install 'fedpeer[{extra}]'"
    assert "error" in doc and hint in doc["error"] and "\n" not in doc["error"], doc
    assert f"fedpeer[{extra}]" in doc["public"] and str(tmp_path) not in doc["public"]
