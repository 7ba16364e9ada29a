"""Every job kind this build of fedpeer knows. Each module keeps heavy imports (scikit-learn,
xgboost) inside its functions, so an idle daemon stays small."""

from __future__ import annotations

from .base import JobKind

# The kinds' names without importing them: config.py checks [policy] allowed_jobs against this
# at load time, and must not pull numpy and the job modules into every CLI call. A test checks
# it equals job_kinds().
KIND_NAMES = ("stats", "sumcheck", "bofrf", "xgboost", "logreg", "mlp", "kmeans", "gmm", "dbscan")


def job_kinds() -> dict[str, JobKind]:
    from . import messages  # noqa: F401  (registers the lifecycle messages with the wire)
    from . import bofrf, dbscan, gmm, kmeans, logreg, mlp, stats, sumcheck, xgboost

    return {k.name: k for k in (stats.KIND, sumcheck.KIND, bofrf.KIND, xgboost.KIND, logreg.KIND, mlp.KIND,
                                kmeans.KIND, gmm.KIND, dbscan.KIND)}
