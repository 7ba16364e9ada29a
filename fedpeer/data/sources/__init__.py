"""Where a site's rows come from: CSV (pyarrow, or the Python parser that words every error),
Parquet, PostgreSQL."""
