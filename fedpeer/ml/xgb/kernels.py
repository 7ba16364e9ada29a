"""The compiled loops of histogram-mode XGBoost (numba): a site's histograms of one level, their
packing into the secure sum's lanes, its rows' move down a level, and the split search over
summed histograms — steps that are one pass over cells in xgboost's C++ and many passes in numpy
(docs/algorithms.md, "Exact histogram mode, the formulas").

Why compiled: the numpy forms (a sparse product per level, fancy indexing per step, the split
search as ~20 whole-array passes over (node, feature, cut)) spent most of their time building
index and temporary arrays, not adding. 50 trees of 80,000 x 50 over 5 sites in one process:
3.0 s against xgboost's 1.1 s (BENCHMARKS.md has the figures after this module).

Exactness: the histograms are int64 sums (exact in any order); the split search does, per
candidate, the same float64 operations in the same order as the formulas in histtree.py (no
fastmath: numba keeps IEEE order), and the first maximum in (feature, cut, direction) order
wins. So the model stays byte for byte what it was.

Memory safety: the loops do not check bounds. `level_histograms` checks every bin index against
the slots once per call and positions come from route_rows; `best_splits_kernel`'s arrays are
shaped by its caller. Every function releases the GIL (nogil): a member's event loop goes on
while its worker thread runs them.

Compiled once per machine: `cache=True` keeps the machine code beside this file (or in numba's
user cache directory); where neither is writable, each process compiles on first use (~1 s,
in the daemon's ML preload, daemon/warmup.py).
"""

from __future__ import annotations

import numpy as np

from fedpeer.ml.jit import jit as _jit

__all__ = ["PACK_BAD_COUNT", "PACK_BAD_HESSIAN", "PACK_DROPPED_ROWS", "best_splits_kernel", "hist_kernel",
           "pack_kernel", "route_kernel", "warm"]

PACK_DROPPED_ROWS, PACK_BAD_COUNT, PACK_BAD_HESSIAN = 1, 2, 3     # pack_kernel's refusals


@_jit
def hist_kernel(bins: np.ndarray, gq: np.ndarray, hq: np.ndarray, slot: np.ndarray, out: np.ndarray) -> None:
    """out[slot[i], f, bins[i, f]] += (gq[i], hq[i], 1) for every row i with slot[i] >= 0.
    out: int64 (nodes, F, S, 3), zeroed by the caller; bins < S checked by the caller."""
    rows, n_features = bins.shape
    for i in range(rows):
        s = slot[i]
        if s < 0:
            continue
        g, h = gq[i], hq[i]
        for f in range(n_features):
            b = bins[i, f]
            out[s, f, b, 0] += g
            out[s, f, b, 1] += h
            out[s, f, b, 2] += 1


@_jit
def pack_kernel(hist: np.ndarray, kept: np.ndarray, fields: np.ndarray, count_bits: int, unit_hessian: bool,
                hess_bits: int, cells_major: bool, out: np.ndarray) -> int:
    """hist.Packing.encode in one pass: hist uint64 (n, C, 3) (int64 bits, C = F * S cells),
    `kept` int64 (K,) the cells that travel (ascending; C of them: every cell), `fields` int64
    (lanes, 2): each lane's low channel and high channel (-1: none), shifted by count_bits.
    out uint64 (n * K * lanes,) in (node, cell, lane) order, or (cell, node, lane) with
    cells_major. Returns 0, or PACK_DROPPED_ROWS (a cell that does not travel holds rows),
    PACK_BAD_COUNT (a row count outside [0, 2^count_bits)), PACK_BAD_HESSIAN (unit_hessian,
    and a cell's Σh is not its rows << hess_bits)."""
    n, n_cells, _ = hist.shape
    n_kept, lanes = kept.shape[0], fields.shape[0]
    if n_kept < n_cells:
        j = 0
        for c in range(n_cells):
            if j < n_kept and kept[j] == c:
                j += 1
                continue
            for node in range(n):
                if hist[node, c, 0] != 0 or hist[node, c, 1] != 0 or hist[node, c, 2] != 0:
                    return PACK_DROPPED_ROWS
    limit = np.uint64(1) << np.uint64(count_bits)
    shift = np.uint64(count_bits)
    for node in range(n):
        for j in range(n_kept):
            c = kept[j]
            rows = hist[node, c, 2]
            if rows >= limit:                    # a negative count is a huge unsigned one
                return PACK_BAD_COUNT
            if unit_hessian and hist[node, c, 1] != rows << np.uint64(hess_bits):
                return PACK_BAD_HESSIAN
            at = (j * n + node) * lanes if cells_major else (node * n_kept + j) * lanes
            for i in range(lanes):
                value = hist[node, c, fields[i, 0]]
                if fields[i, 1] >= 0:
                    value |= hist[node, c, fields[i, 1]] << shift
                out[at + i] = value
    return 0


@_jit
def route_kernel(left: np.ndarray, feature: np.ndarray, cut: np.ndarray, default_left: np.ndarray,
                 bins: np.ndarray, pos: np.ndarray, missing_bin: int) -> None:
    """Each row's node after the splits made so far, in place in pos: a row at a split node goes
    left iff its bin < cut (missing: the node's default direction), until it reaches a node
    without a split. Node ids in pos and left are the caller's (a tree's, as histtree builds)."""
    for i in range(pos.shape[0]):
        p = pos[i]
        while left[p] >= 0:
            b = bins[i, feature[p]]
            go_left = default_left[p] == 1 if b == missing_bin else b < cut[p]
            p = left[p] if go_left else left[p] + 1
        pos[i] = p


@_jit
def _gain(G: float, H: float, reg_lambda: float, min_child_weight: float, max_delta_step: float) -> float:
    """histtree.SplitParams.gain for one node."""
    if H < min_child_weight or H <= 0:
        return 0.0
    if max_delta_step > 0:
        w = -G / (H + reg_lambda)
        w = min(max(w, -max_delta_step), max_delta_step)
        return -(2.0 * G * w + (H + reg_lambda) * w * w)
    return G * G / (H + reg_lambda)


@_jit
def best_splits_kernel(hist: np.ndarray, cut_counts: np.ndarray, g_scale: float, h_scale: float,
                       reg_lambda: float, min_child_weight: float, max_delta_step: float, min_leaf_rows: int,
                       best_chg: np.ndarray, best: np.ndarray, left: np.ndarray, totals: np.ndarray) -> bool:
    """histtree._best over hist int64 (n, F, S, 3) (slot S - 1: missing values): for each node
    the first best candidate in (feature, cut k = 1..S - 2, direction: missing right, then left)
    order. Out: best_chg (n,) float64 (-inf: none allowed), best (n, 3) int64 (feature, cut,
    direction), left (n, 3) the left side's integer sums, totals (n, F, 3) each feature's
    integer totals (the caller checks they agree). Returns False if a hessian or row count in
    hist is negative (nothing else is then meaningful)."""
    n, n_features, n_slots, _ = hist.shape
    n_cuts = n_slots - 2
    for node in range(n):
        for f in range(n_features):
            for c in range(3):
                acc = 0
                for s in range(n_slots):
                    acc += hist[node, f, s, c]
                totals[node, f, c] = acc
    for node in range(n):
        for f in range(n_features):
            for s in range(n_slots):
                if hist[node, f, s, 1] < 0 or hist[node, f, s, 2] < 0:
                    return False
    for node in range(n):
        tg, th, tn = totals[node, 0, 0], totals[node, 0, 1], totals[node, 0, 2]
        G, H = tg * g_scale, th * h_scale
        parent = _gain(G, H, reg_lambda, min_child_weight, max_delta_step)
        chg_best = -np.inf
        bf, bk, bd = 0, 1, 0
        blg, blh, bln = hist[node, 0, 0, 0], hist[node, 0, 0, 1], hist[node, 0, 0, 2]
        for f in range(n_features):
            mg, mh, mn = hist[node, f, n_slots - 1, 0], hist[node, f, n_slots - 1, 1], hist[node, f, n_slots - 1, 2]
            directions = 2 if mn > 0 or mh > 0 else 1       # no missing rows: "left" scores as "right"
            ig, ih, inn = 0, 0, 0
            limit = min(n_cuts, cut_counts[f])
            for k in range(1, limit + 1):
                ig += hist[node, f, k - 1, 0]
                ih += hist[node, f, k - 1, 1]
                inn += hist[node, f, k - 1, 2]
                for d in range(directions):
                    if d == 0:
                        lg, lh, ln = ig, ih, inn
                        gl, hl = ig * g_scale, ih * h_scale
                    else:                       # the float sums as xgboost adds them (differ above 2^53)
                        lg, lh, ln = ig + mg, ih + mh, inn + mn
                        gl, hl = ig * g_scale + mg * g_scale, ih * h_scale + mh * h_scale
                    gr, hr = G - gl, H - hl
                    if hl < min_child_weight or hr < min_child_weight:
                        continue
                    if min_child_weight <= 0 and (hl <= 0 or hr <= 0):
                        continue
                    if ln < min_leaf_rows or ln > tn - min_leaf_rows:
                        continue
                    if max_delta_step > 0:
                        chg = (_gain(gl, hl, reg_lambda, min_child_weight, max_delta_step)
                               + _gain(gr, hr, reg_lambda, min_child_weight, max_delta_step)) - parent
                    else:
                        chg = gl * gl
                        chg /= hl + reg_lambda
                        gr = gr * gr
                        hr = hr + reg_lambda
                        gr /= hr
                        chg += gr
                        chg -= parent
                    if chg > chg_best:
                        chg_best, bf, bk, bd = chg, f, k, d
                        blg, blh, bln = lg, lh, ln
        best_chg[node] = chg_best
        best[node, 0], best[node, 1], best[node, 2] = bf, bk, bd
        left[node, 0], left[node, 1], left[node, 2] = blg, blh, bln
    return True


def warm() -> None:
    """Compile (or load) every kernel on tiny arrays, so no job waits for it."""
    bins = np.zeros((2, 1), dtype=np.uint16)
    ints = np.zeros(2, dtype=np.int64)
    out = np.zeros((1, 1, 3, 3), dtype=np.int64)
    hist_kernel(bins, ints, ints, ints, out)
    hist_kernel(bins.astype(np.uint8), ints, ints, ints, out)
    one = np.full(1, -1, dtype=np.int64)
    route_kernel(one, one + 1, one + 1, one + 1, bins, ints.copy(), 2)
    route_kernel(one, one + 1, one + 1, one + 1, bins.astype(np.uint8), ints.copy(), 2)
    packed = np.zeros(2, dtype=np.uint64)
    pack_kernel(np.zeros((1, 1, 3), dtype=np.uint64), np.zeros(1, dtype=np.int64), np.array([[0, -1], [2, 1]]), 1,
                False, 0, True, packed)
    triple = np.zeros((1, 3), dtype=np.int64)
    best_splits_kernel(out, np.ones(1, dtype=np.int64), 1.0, 1.0, 1.0, 1.0, 0.0, 1, np.zeros(1), triple, triple.copy(),
                       np.zeros((1, 1, 3), dtype=np.int64))
