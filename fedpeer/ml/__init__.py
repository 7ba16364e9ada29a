"""The mathematics, as pure functions on numpy arrays, one family a folder; what families share sits
here (evaluation, moments)."""
