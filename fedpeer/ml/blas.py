"""BLAS on one thread for a job's small matrix steps (`one_blas_thread(fn, *args)`): on a shared
2-core host, several daemons each running OpenBLAS on every core spin against each other
(measured: a logreg Hessian step 0.9 ms on one thread, 150-1,600 ms on two with three daemons;
a DBSCAN site's mixture fit 0.09 s against 1.12 s)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class _OneBlasThread:
    """Runs a step with BLAS on one thread, as scikit-learn runs its k-means and mixture steps. A
    step's matmuls are small (k-means: rows x restarts·k x d, two per chunk of rows; logreg: a d x d
    Hessian): BLAS's own threads spend more time waking and waiting than computing, and waiting
    threads spin, taking the cores from the other work of the machine (on a shared host: 2-3x the
    CPU of one thread). OpenBLAS's pool is process-wide and threadpoolctl lets one Python thread at
    a time limit it, so the limit is set and lifted around the step in the thread that computes (a
    limit left set in one executor thread would be ignored in the next); a step running while
    another thread holds the limit runs with what that thread set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._controller: Any = None        # numpy's BLAS, found once (~1 ms a search)

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._controller is None:
                from threadpoolctl import ThreadpoolController
                self._controller = ThreadpoolController()
        with self._controller.limit(limits=1, user_api="blas"):
            return fn(*args)


one_blas_thread = _OneBlasThread()
