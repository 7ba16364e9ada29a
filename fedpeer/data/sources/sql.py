"""[data] sql: a site's rows are the result of a query against its PostgreSQL database.

`read_sql` returns what `csvtext.read_csv` returns for a CSV (feature names, float64 matrix with NaN where
a value is missing, label codes and their distinct values, row locator), so that `data._finish`
applies every rule of a CSV source — label, positive class, missing policy, row cap, schema
fingerprint — to the query's result, and a query giving the same columns and values as a CSV gives
the same Dataset.

- The connection string is read from `dsn_file` (mode 0600, refused like the identity key file when
  its group or others may read it). The password is never put in a message: connection strings are
  parsed here first (libpq quotes pieces of a malformed one), and every message is scrubbed of it.
- One read-only transaction (`default_transaction_read_only` and `BEGIN READ ONLY`), every
  statement bounded by `statement_timeout` (`sql_timeout_ms`), connecting bounded by
  `CONNECT_TIMEOUT_S`. On any error the running statement is cancelled and the connection closed.
- Column types come from the query's result description (no rows read): integers, floats, numeric
  and booleans are features (cast to float8 by the server, booleans as 1/0); text, dates and other
  types are refused naming the column and the fix. The label may be text, an integer or a boolean.
- The rows travel as `COPY (...) TO STDOUT (FORMAT csv)` — only the feature and label columns, at
  most rows_max + 1 rows, at most bytes_max bytes — and are parsed by pyarrow's CSV reader, piece
  by piece in a helper thread while the next rows arrive.
- Blocking (network, parsing): jobs call it through `sitedata.load_site` in a worker thread.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.data.spec import need_extra
from fedpeer.errors import DataError

__all__ = ["read_sql", "SOURCE", "CONNECT_TIMEOUT_S", "SQL_TIMEOUT_MS_DEFAULT", "DSN_FILE_BYTES_MAX"]

SOURCE = "[data] sql"
"""How messages name a SQL source."""
SQL_TIMEOUT_MS_DEFAULT = 60_000
"""[data] sql_timeout_ms when not given: the server cancels a statement running longer."""
CONNECT_TIMEOUT_S = 10
"""Seconds to reach the server and log in (libpq's connect_timeout)."""
DSN_FILE_BYTES_MAX = 64 * 1024
APPLICATION_NAME = "fedpeer"
"""pg_stat_activity.application_name of fedpeer's sessions (a DBA sees who runs the query)."""

# Result column types by OID (pg_type.dat). Domains are reported by their base type.
_NUMBER = {20: "bigint", 21: "smallint", 23: "integer", 26: "oid", 700: "real", 701: "double precision",
           1700: "numeric"}
_BOOL = {16: "boolean"}
_INT = {20: "bigint", 21: "smallint", 23: "integer"}
_TEXT = {25: "text", 1043: "character varying", 1042: "character", 19: "name", 18: "\"char\""}
_TIME = {1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamp with time zone", 1186: "interval",
         1266: "time with time zone"}


class _ResultRows:
    """Rows of a query result are named by their 1-based position in it."""

    def where(self, index: int) -> str:
        return f"row {index + 1} of the query result"


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def read_dsn(path: Path) -> str:
    """The connection string in `path`, refused unless only its owner can read it."""
    where = f"{SOURCE}: dsn_file {path}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{where} does not exist; put the PostgreSQL connection string in it "
                        f"(postgresql://user:password@host/db) and run: chmod 600 {path}") from None
    except OSError as e:
        raise DataError(f"{where}: cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{where} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DataError(f"{where} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                        f"run: chmod 600 {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read(DSN_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise DataError(f"{where}: cannot be read: {e.strerror or e}") from None
    if len(raw) > DSN_FILE_BYTES_MAX:
        raise DataError(f"{where} is larger than {DSN_FILE_BYTES_MAX} bytes; it must hold only the connection string")
    try:
        dsn = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise DataError(f"{where} is not UTF-8 text") from None
    if not dsn:
        raise DataError(f"{where} is empty; put the PostgreSQL connection string in it "
                        "(postgresql://user:password@host/db)")
    return dsn


def _parse_dsn(dsn: str, path: Path) -> tuple[dict[str, Any], str | None]:
    """(connection parameters, password or None). libpq's own message for a malformed string may
    quote a piece of it (the password), so it is not shown."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        raise DataError(f"{SOURCE}: dsn_file {path} does not hold a valid PostgreSQL connection string "
                        "(postgresql://user:password@host:port/dbname, or key=value pairs such as "
                        "host=... dbname=... user=... password=...; quote values that hold spaces); "
                        "libpq's message is not shown as it may quote the password") from None
    password = params.get("password")
    return params, (str(password) if password else None)


def _kind(oid: int) -> str:
    if oid in _NUMBER:
        return "number"
    if oid in _BOOL:
        return "bool"
    if oid in _TEXT:
        return "text"
    if oid in _TIME:
        return "time"
    return "other"


def _type_name(conn: Any, oid: int) -> str:
    for table in (_NUMBER, _BOOL, _TEXT, _TIME):
        if oid in table:
            return table[oid]
    info = conn.adapters.types.get(oid)
    return info.name if info is not None else f"type oid {oid}"


def read_sql(spec: Any, rows_max: int, bytes_max: int) -> tuple[Any, ...]:
    """(features, X, codes, uniques, rows) of `spec.sql` run with the connection string in
    `spec.dsn_file`, as `csvtext.read_csv` gives them for a CSV with the same columns and values.
    Raises DataError naming the source ("[data] sql") and never the password."""
    dsn_path = Path(spec.dsn_file) if spec.dsn_file is not None else None
    if dsn_path is None:
        raise DataError(f"{SOURCE}: dsn_file is not set; name the file that holds the connection string")
    query = spec.sql.strip().rstrip(";").strip() if isinstance(spec.sql, str) else ""
    if not query:
        raise DataError(f"{SOURCE}: the query is empty; write the SELECT that returns the site's rows")
    query += "\n"           # it is put in parentheses: a last line that is a -- comment ends before the ")"
    timeout_ms = int(spec.sql_timeout_ms)
    psycopg = need_extra("psycopg", "sql", SOURCE)
    need_extra("pyarrow.csv", "sql", SOURCE)     # the query's rows are parsed as CSV by pyarrow
    params, password = _parse_dsn(read_dsn(dsn_path), dsn_path)
    try:
        return _run(psycopg, params, query, spec, timeout_ms, rows_max, bytes_max, dsn_path)
    except DataError as e:
        raise DataError(_redact(str(e), password)) from None


def _run(psycopg: Any, params: dict[str, Any], query: str, spec: Any, timeout_ms: int, rows_max: int,
         bytes_max: int, dsn_path: Path) -> tuple[Any, ...]:
    from psycopg import sql as q

    params = {**params, "connect_timeout": str(CONNECT_TIMEOUT_S), "application_name": APPLICATION_NAME}
    try:
        conn = psycopg.connect(**params, autocommit=True)
    except psycopg.Error as e:
        text = " ".join(str(e).split())
        raise DataError(f"{SOURCE}: cannot connect to the database: {text}; check the server and the "
                        f"connection string in dsn_file {dsn_path}") from None
    try:
        with conn.cursor() as cur:
            try:
                cur.execute(q.SQL("SET statement_timeout = {}").format(q.Literal(timeout_ms)))
                cur.execute("SET default_transaction_read_only = on")
                cur.execute("BEGIN READ ONLY")
                cur.execute(q.SQL("SELECT * FROM ({}) AS fedpeer_q LIMIT 0").format(q.SQL(query)))
                names = [d.name for d in cur.description or ()]
                oids = [d.type_code for d in cur.description or ()]
                copy_sql, features, label_kind = _plan(conn, q, query, spec, names, oids, rows_max)
                tables = _copy(cur, copy_sql, bytes_max, features, label_kind)
                cur.execute("COMMIT")
            except psycopg.errors.QueryCanceled:
                raise DataError(f"{SOURCE}: the query ran past the statement timeout of {timeout_ms} ms "
                                "(sql_timeout_ms) and was cancelled; make it faster (an index, fewer rows) or "
                                "raise sql_timeout_ms") from None
            except psycopg.Error as e:
                raise DataError(f"{SOURCE}: the query failed: {_server_message(e)}; fix the query in "
                                "[data] sql") from None
    except BaseException:
        try:
            conn.cancel_safe(timeout=2)
        except Exception:
            pass
        raise
    finally:
        conn.close()
    return _parse(tables, features, spec.label, rows_max)


def _server_message(e: Exception) -> str:
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or " ".join(str(e).split())
    sqlstate = getattr(e, "sqlstate", None)
    hint = getattr(diag, "message_hint", None) if diag is not None else None
    return text + (f" (SQLSTATE {sqlstate})" if sqlstate else "") + (f"; hint: {hint}" if hint else "")


def _plan(conn: Any, q: Any, query: str, spec: Any, header: list[str], oids: list[int], rows_max: int):
    """The COPY statement of the feature and label columns, the features, the label's kind."""
    from fedpeer.data.spec import check_columns

    if not header:
        raise DataError(f"{SOURCE}: the query returns no columns")
    seen = check_columns(SOURCE, header, spec, "name them apart with AS in the query")
    if spec.label is not None and spec.label in spec.ignore:
        raise DataError(f"{SOURCE}: the label column {spec.label!r} is also listed in ignore; remove it from ignore")
    ignored = set(spec.ignore)
    features = tuple(n for n in header if n != spec.label and n not in ignored)
    if not features:
        raise DataError(f"{SOURCE}: no feature columns left (all columns are the label or ignored)")
    exprs = []
    for name in features:
        oid = oids[seen[name]]
        kind = _kind(oid)
        col = q.Identifier(name)
        if kind == "number":
            exprs.append(q.SQL("{}::float8").format(col))
            continue
        if kind == "bool":
            exprs.append(q.SQL("{}::int::float8").format(col))
            continue
        t = _type_name(conn, oid)
        fix = {"text": "is text in the query result; encode it as numbers in the query or add it to ignore "
                       "(an identifier?)",
               "time": "is a date or time in the query result; turn it into a number in the query (for "
                       "example days since an event) or add it to ignore"}.get(
            kind, "is not a number column in the query result; cast it to a number in the query or add it "
                  "to ignore")
        raise DataError(f"{SOURCE}: column {name!r} ({t}) {fix}",
                        public=f"column {name!r} is not a number column in its data; make it one, or add it "
                        "to [data] ignore there")
    label_kind = None
    if spec.label is not None:
        oid = oids[seen[spec.label]]
        col = q.Identifier(spec.label)
        if oid in _TEXT:
            label_kind = "text"
            exprs.append(q.SQL("{}::text").format(col))
        elif oid in _INT:
            label_kind = "int"
            exprs.append(q.SQL("{}::text").format(col))
        elif oid in _BOOL:                  # "True" / "False", as the Parquet source and pandas' CSVs
            label_kind = "bool"
            exprs.append(q.SQL("CASE WHEN {0} THEN 'True' WHEN NOT {0} THEN 'False' END").format(col))
        else:
            raise DataError(f"{SOURCE}: label column {spec.label!r} is {_type_name(conn, oid)} in the query "
                            "result; a label must be text, an integer or a boolean (the class)")
    select = q.SQL("SELECT {} FROM ({}) AS fedpeer_q LIMIT {}").format(
        q.SQL(", ").join(exprs), q.SQL(query), q.Literal(rows_max + 1))
    return q.SQL("COPY ({}) TO STDOUT (FORMAT csv)").format(select), features, label_kind


def _copy(cur: Any, statement: Any, bytes_max: int, features: tuple[str, ...], label_kind: str | None) -> list:
    """The COPY's rows as pyarrow tables, refused past bytes_max of CSV text. libpq hands the text over a
    row at a time; every PIECE_BYTES of whole rows are parsed in a helper thread while the next arrive,
    so parsing overlaps the transfer and at most two pieces of text are held at once."""
    from concurrent.futures import ThreadPoolExecutor

    tables: list = []
    size = 0
    piece = bytearray()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedpeer-sql-parse") as pool:
        pending = None
        try:
            with cur.copy(statement) as copy:
                for chunk in copy:
                    size += len(chunk)
                    if size > bytes_max:      # raised inside: psycopg cancels the COPY (not read to its end)
                        raise DataError(f"{SOURCE}: the query's result is more than the limit of {bytes_max} "
                                        "bytes (bytes_max, counted as CSV text); select fewer rows or raise the limit")
                    piece += chunk
                    if len(piece) >= PIECE_BYTES:
                        if pending is not None:
                            tables.append(pending.result())
                        pending, piece = pool.submit(_parse_piece, bytes(piece), features, label_kind), bytearray()
            if pending is not None:
                tables.append(pending.result())
                pending = None
            if piece:
                tables.append(_parse_piece(bytes(piece), features, label_kind))
        finally:
            if pending is not None:
                pending.cancel()
    return tables


PIECE_BYTES = 16 << 20
"""CSV text parsed at a time, in a helper thread, while the next rows arrive."""


def _parse_piece(data: bytes, features: tuple[str, ...], label_kind: str | None):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = [f"c{i}" for i in range(len(features) + (label_kind is not None))]
    types = {name: pa.float64() for name in names[:len(features)]}
    if label_kind is not None:
        types[names[-1]] = pa.string()
    try:
        return pacsv.read_csv(
            pa.BufferReader(data),
            read_options=pacsv.ReadOptions(use_threads=True, column_names=names, block_size=1 << 20),
            parse_options=pacsv.ParseOptions(delimiter=",", quote_char='"', double_quote=True, escape_char=False,
                                             newlines_in_values=label_kind == "text", ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True,
                                                 quoted_strings_can_be_null=False, true_values=[],
                                                 false_values=[], auto_dict_encode=False))
    except (pa.ArrowException, ValueError) as e:     # the server's CSV is well-formed: a bug if this happens
        raise DataError(f"{SOURCE}: reading the query's result failed ({e})") from None


def _parse(tables: list, features: tuple[str, ...], label: str | None, rows_max: int) -> tuple[Any, ...]:
    import pyarrow as pa

    from fedpeer.data.sources.csv_arrow import _label_codes, _matrix

    n = sum(t.num_rows for t in tables)
    if n == 0:
        raise DataError(f"{SOURCE}: the query returned no rows")
    if n > rows_max:
        raise DataError(f"{SOURCE}: the query returns more than {rows_max} rows (rows_max); select a sample "
                        "or raise the limit")
    nf = len(features)
    if label is not None:
        column = pa.chunked_array([c for t in tables for c in t.column(nf).chunks], type=pa.string())
        codes, uniques = _label_codes(column, _label_text)
        del column
    else:
        uniques, codes = [""], np.zeros(n, dtype=np.int64)
    batches = [b for t in tables for b in t.select(list(range(nf))).to_batches()]
    tables.clear()
    return features, _matrix(batches, n), codes, uniques, _ResultRows()


def _label_text(value: str | None) -> str:
    return "" if value is None else value.strip()
