"""[data] sql against a real PostgreSQL (tests/integration/pg.py starts one): the query's result is
the same Dataset as a CSV of the same rows; every failure is a DataError naming "[data] sql" and
never the password, with nothing left running on the server; stats, bofrf and xgboost jobs over
three daemons whose sites read disjoint rows from the server equal the same jobs on CSV sites."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import pytest

from fedpeer.config import load as cfg
from fedpeer.data.dataset import DataSpec, load_csv, load_data
from fedpeer.errors import ConfigError, DataError
from tests.integration.pg import PASSWORD, PgServer, breast_cancer_columns, postgres_fixture  # noqa: F401

pytestmark = pytest.mark.integration
COLS = breast_cancer_columns()
SITE_QUERY = "SELECT {cols}, diagnosis FROM cancer WHERE id % 3 = {k} ORDER BY id"


def _select(k: int) -> str:
    return SITE_QUERY.format(cols=", ".join(COLS), k=k)


def _dsn_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def _spec(dsn: Path, sql: str, **kw) -> DataSpec:
    kw = {"label": "diagnosis", "positive": "malignant", **kw}
    return DataSpec(csv=None, sql=sql, dsn_file=dsn, **kw)


def _rows_csv(path: Path, k: int, extra: bool = False) -> Path:
    """The rows id % 3 == k of the table as a CSV (the values the fixture loaded, in id order)."""
    from sklearn.datasets import load_breast_cancer

    ds = load_breast_cancer()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLS + ["diagnosis"] + (["smoker", "grade", "ratio"] if extra else []))
        for i, (row, target) in enumerate(zip(ds.data, ds.target)):
            if i % 3 == k:
                more = [int(i % 2 == 0), int(target), repr(float(np.float32(0.1 * (i % 7))))] if extra else []
                w.writerow([repr(float(v)) for v in row] + ["malignant" if target == 0 else "benign"] + more)
    return path


def _same(a, b) -> None:
    assert a.features == b.features and a.fingerprint == b.fingerprint
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y) and np.array_equal(a.labels, b.labels)
    assert a.rows_dropped == b.rows_dropped and a.missing_counts == b.missing_counts


def _error(spec: DataSpec, **kw) -> str:
    with pytest.raises(DataError) as e:
        load_data(spec, **kw)
    text = str(e.value)
    assert PASSWORD not in text and "s3cret" not in text, text
    assert text.startswith("[data] sql"), text
    return text


def _fedpeer_sessions(server: PgServer) -> list:
    with server.admin() as conn:
        return conn.execute("SELECT pid, state, query FROM pg_stat_activity WHERE application_name = 'fedpeer'"
                            ).fetchall()


def _no_session_left(server: PgServer) -> None:
    deadline = time.monotonic() + 5
    while (left := _fedpeer_sessions(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], left


# ---------------------------------------------------------------------------------------------
# The source.

def test_query_gives_the_csv_dataset_of_the_same_rows(postgres_server: PgServer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from fedpeer.data.sources import sql as sqlsource

    dsn = _dsn_file(tmp_path / "pg.dsn", postgres_server.dsn())
    for k in range(3):
        got = load_data(_spec(dsn, _select(k) + " ;"))
        want = load_csv(DataSpec(csv=_rows_csv(tmp_path / f"{k}.csv", k), label="diagnosis", positive="malignant"))
        _same(got, want)
        assert got.rows == want.rows > 180
    # a query whose last line is a comment (it is put in parentheses by the reader)
    _same(load_data(_spec(dsn, _select(2) + "  -- the cohort; one row a patient")), want)
    # booleans are 1/0, integers and reals (float4) their exact double; ignored columns are not read
    sql = (f"SELECT id, note, {', '.join(COLS)}, diagnosis, smoker, grade, ratio FROM cancer "
           "WHERE id % 3 = 1 ORDER BY id")
    got = load_data(_spec(dsn, sql, ignore=("id", "note")))
    want = load_csv(DataSpec(csv=_rows_csv(tmp_path / "x.csv", 1, extra=True), label="diagnosis",
                             positive="malignant"))
    _same(got, want)
    # parsed piece by piece while the rows arrive: the same Dataset from many pieces
    monkeypatch.setattr(sqlsource, "PIECE_BYTES", 5000)
    _same(load_data(_spec(dsn, sql, ignore=("id", "note"))), want)
    _no_session_left(postgres_server)


def test_label_types_and_missing_values_follow_the_csv_rules(postgres_server: PgServer, tmp_path: Path) -> None:
    dsn = _dsn_file(tmp_path / "pg.dsn", postgres_server.dsn())
    ints = load_data(_spec(dsn, "SELECT mean_radius, grade FROM cancer ORDER BY id", label="grade", positive="1"))
    assert set(ints.labels) == {"0", "1"} and ints.y.sum() == 357
    bools = load_data(_spec(dsn, "SELECT mean_radius, smoker FROM cancer ORDER BY id", label="smoker",
                            positive="True"))
    assert set(bools.labels) == {"True", "False"} and bools.y.sum() == 285
    gaps = ("SELECT CASE WHEN id IN (4, 9) THEN NULL ELSE mean_radius END AS mean_radius, diagnosis "
            "FROM cancer ORDER BY id")
    text = _error(_spec(dsn, gaps))
    assert "column 'mean_radius' has 2 missing values (first at row 5 of the query result)" in text
    assert 'missing = "drop"' in text
    odd = ("SELECT CASE id WHEN 3 THEN 'Infinity'::float8 WHEN 6 THEN 'NaN' ELSE mean_radius END AS mean_radius, "
           "diagnosis FROM cancer ORDER BY id")
    text = _error(_spec(dsn, odd))
    assert "'mean_radius' has 1 missing value (first at row 7" in text and "1 infinite value (first at row 4" in text
    dropped = load_data(_spec(dsn, gaps, missing="drop"))
    assert dropped.rows == 567 and dropped.rows_dropped == 2
    assert "returned no rows" in _error(_spec(dsn, "SELECT mean_radius, diagnosis FROM cancer WHERE false"))
    assert "more than 100 rows (rows_max)" in _error(_spec(dsn, "SELECT mean_radius, diagnosis FROM cancer"),
                                                    rows_max=100)
    assert "more than the limit of 1000 bytes" in _error(_spec(dsn, "SELECT mean_radius, diagnosis FROM cancer"),
                                                         bytes_max=1000)
    assert "label column 'Diagnosis' not found (did you mean 'diagnosis'?)" in _error(
        _spec(dsn, "SELECT mean_radius, diagnosis FROM cancer", label="Diagnosis"))
    assert "appears twice" in _error(_spec(dsn, "SELECT mean_radius, mean_radius, diagnosis FROM cancer"))
    assert "label must be text, an integer or a boolean" in _error(
        _spec(dsn, "SELECT mean_radius, ratio FROM cancer", label="ratio", positive="0"))
    _no_session_left(postgres_server)


def test_every_failure_names_the_source_never_the_password_and_leaves_nothing_running(
        postgres_server: PgServer, tmp_path: Path) -> None:
    good = _dsn_file(tmp_path / "pg.dsn", postgres_server.dsn())
    query = _select(0)
    # a text feature column, a date column: refused naming the column and the fix
    text = _error(_spec(good, "SELECT mean_radius, note, diagnosis FROM cancer"))
    assert "column 'note' (text) is text in the query result" in text and "add it to ignore" in text
    text = _error(_spec(good, "SELECT mean_radius, now()::date AS day, diagnosis FROM cancer"))
    assert "column 'day' (date) is a date or time" in text
    # the server's message for a query error, a table the role may not read, a write
    text = _error(_spec(good, "SELECT mean_radius, diagnosis FROM cancre"))
    assert 'the query failed: relation "cancre" does not exist (SQLSTATE 42P01)' in text
    assert "permission denied for table secrets" in _error(_spec(good, "SELECT x AS mean_radius, 'a' AS diagnosis "
                                                                 "FROM secrets"))
    text = _error(_spec(good, "SELECT mean_radius, diagnosis, nextval('tickets') AS n FROM cancer", ignore=("n",)))
    assert "read-only transaction" in text
    # past the statement timeout: cancelled by the server, the session gone
    slow = "SELECT mean_radius, diagnosis FROM cancer WHERE (SELECT pg_sleep(30)::text) IS NOT NULL"
    started = time.monotonic()
    text = _error(_spec(good, slow, sql_timeout_ms=300))
    assert time.monotonic() - started < 5
    assert "ran past the statement timeout of 300 ms (sql_timeout_ms) and was cancelled" in text
    _no_session_left(postgres_server)
    # wrong password, unreachable server, a malformed connection string that holds the password
    text = _error(_spec(_dsn_file(tmp_path / "bad.dsn", postgres_server.dsn(password="wrong " + PASSWORD)), query))
    assert "cannot connect to the database" in text and "password authentication failed" in text
    assert "wrong" not in text
    port = postgres_server.port + 1 if postgres_server.port < 65535 else 1024
    text = _error(_spec(_dsn_file(tmp_path / "down.dsn", postgres_server.dsn(port=port)), query))
    assert "cannot connect to the database" in text and str(port) in text
    text = _error(_spec(_dsn_file(tmp_path / "junk.dsn", f"host=127.0.0.1 password={PASSWORD} user"), query))
    assert "does not hold a valid PostgreSQL connection string" in text
    # the dsn file: others may read it, missing, empty
    loose = _dsn_file(tmp_path / "loose.dsn", postgres_server.dsn(), mode=0o640)
    text = _error(_spec(loose, query))
    assert text == f"[data] sql: dsn_file {loose} is readable by others (mode 0640); run: chmod 600 {loose}"
    assert "does not exist" in _error(_spec(tmp_path / "none.dsn", query))
    assert "is empty" in _error(_spec(_dsn_file(tmp_path / "empty.dsn", ""), query))
    _no_session_left(postgres_server)


def test_config_takes_sql_with_a_dsn_file_only(tmp_path: Path) -> None:
    from fedpeer.data.site import spec_for

    def load(data: str):
        path = tmp_path / "peers.toml"
        path.write_text(f'[node]\nname = "a"\nlisten = "127.0.0.1:1"\n\n[data]\n{data}\n')
        return cfg.load(path)
    conf = load('sql = "SELECT 1"\ndsn_file = "pg.dsn"\nlabel = "y"\nsql_timeout_ms = 5000')
    assert conf.data.dsn_file == str(tmp_path / "pg.dsn") and conf.data.sql_timeout_ms == 5000
    spec = spec_for(conf.data, needs_label=True)
    assert spec.sql == "SELECT 1" and spec.dsn_file == tmp_path / "pg.dsn" and spec.sql_timeout_ms == 5000
    assert spec.source == "[data] sql" and spec.csv is None and spec.parquet is None
    with pytest.raises(ConfigError, match="data.dsn_file: sql and dsn_file go together"):
        load('sql = "SELECT 1"\nlabel = "y"')
    with pytest.raises(ConfigError, match="data.sql: set one of csv, parquet and sql"):
        load('sql = "SELECT 1"\ndsn_file = "pg.dsn"\ncsv = "a.csv"')
    with pytest.raises(ConfigError, match="data.sql_timeout_ms"):
        load('sql = "SELECT 1"\ndsn_file = "pg.dsn"\nsql_timeout_ms = 0')


# ---------------------------------------------------------------------------------------------
# Jobs over three daemons reading their rows from the server.

def _attach(h, server: PgServer, tmp_path: Path) -> list[Path]:
    from fedpeer.app.sitefiles import add_peers

    csvs = []
    for k, site in enumerate(h.sites):
        _dsn_file(site.dir / "pg.dsn", server.dsn())
        add_peers(site.config_path, [], {"data": {"sql": _select(k), "dsn_file": "pg.dsn", "label": "diagnosis",
                                                  "positive": "malignant"}})
        site.config = cfg.load(site.config_path)
        csvs.append(_rows_csv(tmp_path / f"site{k}.csv", k))
    text = "".join(site.config_path.read_text() for site in h.sites)
    assert PASSWORD not in text and "s3cret" not in text
    return csvs


async def test_jobs_on_sql_sites_equal_the_jobs_on_csv_sites(make_federation, postgres_server: PgServer,
                                                             tmp_path: Path) -> None:
    from fedpeer.identity import parse_public_key
    from fedpeer.kinds.forest import bofrf
    from fedpeer.ml.xgb import histrun
    from tests.integration.test_jobs import _attach_data

    h = make_federation(3, start=False)
    csvs = _attach(h, postgres_server, tmp_path)
    ref = make_federation(3, start=False)
    _attach_data(ref, csvs, label="diagnosis", positive="malignant")
    h.start()
    ref.start()
    await h.wait_all_alive(timeout_s=30)
    await ref.wait_all_alive(timeout_s=30)

    stats = {"bins": 8, "secure_sum": "pairwise"}
    got_id, want_id = await h.propose(0, "stats", stats), await ref.propose(0, "stats", stats)
    got, want = await h.wait_job(got_id, timeout_s=60), await ref.wait_job(want_id, timeout_s=60)
    ref.stop()
    assert {r["state"] for r in got.values()} == {"done"}, [r["error"] for r in got.values()]
    assert {r["state"] for r in want.values()} == {"done"}, [r["error"] for r in want.values()]
    def same_order(result: dict) -> dict:      # participants come in ring order: the keys' order
        return {**result, "participants": sorted(result["participants"])}
    assert all(same_order(r["result"]) == same_order(want[0]["result"]) for r in [*got.values(), *want.values()])
    assert got[0]["result"]["count"] == 569

    datasets = [load_csv(DataSpec(csv=p, label="diagnosis", positive="malignant")) for p in csvs]
    xgb_params = {"mode": "histogram", "rounds": 4, "max_depth": 3, "eta": 0.3, "max_bin": 32, "test_fraction": 0.0,
                  "nthread": 1, "secure_sum": "ring"}
    job_id = await h.propose(1, "xgboost", xgb_params)
    records = await h.wait_job(job_id, timeout_s=90)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    model = histrun.train_reference([d.X for d in datasets], [d.y for d in datasets],
                                    {"num_round": 4, "max_depth": 3, "eta": 0.3, "max_bin": 32})
    assert all(Path(r["result"]["model_file"]).read_bytes() == model for r in records.values())

    params = {"n_estimators": 15, "seed": 7, "baseline": "boppid", "boppid_rounds": 10}
    job_id = await h.propose(2, "bofrf", params)
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    keys = [parse_public_key(s.public_key) for s in h.sites]
    order = sorted(range(3), key=lambda i: keys[i])
    expected = bofrf.reference([datasets[i] for i in order], [keys[i] for i in order],
                               {k: p.default for k, p in bofrf.PARAMS.items()} | params)
    for pos, i in enumerate(order):
        result, (want_result, _forest, want_weights) = records[i]["result"], expected[pos]
        for block in ("local_rf", "bofrf_local", "bofrf_global", "final"):
            assert result[block] == want_result[block], (i, block)
        assert np.array_equal(bofrf.load_model(result["model_file"])[1], want_weights)

    # a site whose password is wrong: the job fails naming that site and its source, not the password
    _dsn_file(h.sites[2].dir / "pg.dsn", postgres_server.dsn(password="wrong-" + PASSWORD))
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    for record in records.values():
        assert record["state"] == "failed", record
        assert PASSWORD not in record["error"] and "s3cret" not in record["error"]
    mine = records[2]["error"]
    assert "[data] sql: cannot connect to the database" in mine and "password authentication failed" in mine, mine
    assert any("site-3" in r["error"] for r in records.values()), [r["error"] for r in records.values()]
    for site in h.sites:
        assert "s3cret" not in site.log_path.read_text()
    _no_session_left(postgres_server)

    # a query error, a text column, a query past the statement timeout: each a job error naming the
    # site and its source (one job kind each), the site's config changed by a reload
    from fedpeer.app.sitefiles import add_peers
    from fedpeer.daemon.admin import request

    _dsn_file(h.sites[2].dir / "pg.dsn", postgres_server.dsn())
    slow = "SELECT mean_radius, diagnosis FROM cancer WHERE (SELECT pg_sleep(30)::text) IS NOT NULL"
    for kind, params, sql, words in (
            ("xgboost", {"mode": "histogram", "rounds": 2}, "SELECT mean_radius, diagnosis FROM cancre",
             'the query failed: relation "cancre" does not exist'),
            ("bofrf", {"n_estimators": 5}, "SELECT mean_radius, note, diagnosis FROM cancer",
             "column 'note' (text) is text in the query result"),
            ("stats", {}, slow, "ran past the statement timeout of 500 ms")):
        add_peers(h.sites[2].config_path, [], {"data": {"sql": sql, "sql_timeout_ms": 500}})
        h.sites[2].config = cfg.load(h.sites[2].config_path)
        await request(h.sites[2].config, "POST", "/v1/reload")
        started = time.monotonic()
        records = await h.wait_job(await h.propose(0, kind, params), timeout_s=60)
        assert time.monotonic() - started < 30, kind
        assert {r["state"] for r in records.values()} == {"failed"}, (kind, records)
        assert words in records[2]["error"] and "[data] sql" in records[2]["error"], records[2]["error"]
        assert all("site-3" in r["error"] for r in records.values()), [r["error"] for r in records.values()]
    _no_session_left(postgres_server)


def test_data_check_reports_the_sql_source(postgres_server: PgServer, tmp_path: Path) -> None:
    """`fedpeer data check` loads [data] sql exactly as a job does (sitedata.report)."""
    from fedpeer.app.datacheck import format_report, report

    _dsn_file(tmp_path / "pg.dsn", postgres_server.dsn())
    path = tmp_path / "peers.toml"
    path.write_text(f'[node]\nname = "a"\nlisten = "127.0.0.1:1"\n\n[data]\nsql = "{_select(2)}"\n'
                    'dsn_file = "pg.dsn"\nlabel = "diagnosis"\npositive = "malignant"\n')
    conf = cfg.load(path)
    doc = report(conf.data, conf.jobs)
    want = load_csv(DataSpec(csv=_rows_csv(tmp_path / "2.csv", 2), label="diagnosis", positive="malignant"))
    assert doc["source"] == "[data] sql" and doc["rows"] == want.rows
    assert doc["schema_fingerprint"] == want.fingerprint.hex()
    assert format_report(doc).startswith(f"[data] sql: {want.rows} rows, 30 features")
