"""What a daemon does once so that jobs cost less later: its garbage collector's thresholds, and
the training libraries imported ahead of the first job (then frozen out of the collector's walks)."""

from __future__ import annotations

import gc
import logging
import time

from fedpeer.base.logs import fields

log = logging.getLogger("fedpeer.node")

# CPython collects its youngest generation every 700 container allocations and, every 100 of
# those, walks every object the daemon holds (with the ML libraries loaded, over a million). A
# daemon in a histogram job allocates short-lived frames, dicts and tasks by the thousand per
# sum: in-process, 5 members x 10 trees spent 6 % of their CPU in the collector at the defaults,
# 1 % at these (and the frozen imports are never walked again).
GC_THRESHOLDS = (20_000, 20, 20)
LOADED_EVENT = "ml_libraries_loaded"      # logged once the preload is done (the harness waits for it)


def tune_gc() -> None:
    """The daemon's collector thresholds (GC_THRESHOLDS), once at start."""
    gc.set_threshold(*GC_THRESHOLDS)


def preload_ml() -> None:
    """Import the training libraries in a worker thread once the daemon serves, and load (or
    compile, the first time on a machine) the compiled loops (histogram XGBoost's, k-means'): a job's first step
    no longer pays for it (xgboost + scikit-learn: ~4 s of a 3-round job's 4.5 s, cold)."""
    started = time.perf_counter()
    import dp_accounting.rdp.rdp_privacy_accountant  # noqa: F401
    import sklearn.ensemble  # noqa: F401
    import xgboost  # noqa: F401

    from fedpeer.ml.cluster import kernels as cluster_kernels
    from fedpeer.ml.xgb import kernels as xgb_kernels
    xgb_kernels.warm()
    cluster_kernels.warm()

    gc.freeze()        # the libraries' objects live as long as the daemon: the collector skips them from now on
    log.info(LOADED_EVENT, extra=fields(seconds=round(time.perf_counter() - started, 2)))
