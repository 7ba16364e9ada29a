"""BOPPID (Gençtürk's BOFRF thesis §2.3.1.3, Alg. 4), the baseline the thesis compares BOFRF with, as pure
functions on numpy arrays: every site's local AdaBoost (stumps.py), the errors of every site's
model on a site's own rows, the selection S, the coefficients σλ, and the site's own combined model.

Rules of this module: no networking, no clock, no logging, no global random state, no mutation of
the caller's arrays. Labels are int 0/1 (1 = positive).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedpeer.ml.forest.stumps import Stumps, _as_labels, _finite_matrix, adaboost, stumps_score

__all__ = [
    "boppid_local", "boppid_errors", "boppid_select", "boppid_coefficients", "boppid_combine",
    "boppid_reference", "boppid_score", "BOPPID_TAU",
]

# ---------------------------------------------------------------------------------------------
# BOPPID (thesis §2.3.1.3, Alg. 4) — the baseline the thesis compares BOFRF with (§6.3, ch. 7)
# ---------------------------------------------------------------------------------------------
#
# As implemented, for M sites p = 0..M-1 with n^p training rows each:
#  1. every site trains a local AdaBoost H^p = {(h^{p(t)}, α^{p(t)})}, t <= T, on its own rows
#     (Alg. 4 line 2, eq. 2.10; AdaBoost as Alg. 2 with exact stumps, stumps.py)    `boppid_local`
#  2. every site sends H^p and n^p to every other site (line 4; "shares its local AdaBoost
#     classifier and sample size") — no secure sum is involved: the models travel like BOFRF's
#     forests and n^p is sent in the clear, as in the thesis;
#  3. site p evaluates every H^q on its own rows: ε_p^q = (1/n^p) Σ I(H^q(x) != y) (line 9), its
#     own ε_p = ε_p^p (line 3, training error; H(x) = sign(Σ α h), 0 -> negative)  `boppid_errors`
#  4. S = {p} ∪ {q : |ε_p − ε_p^q| <= τ} (lines 7–13)                                `boppid_select`
#     DEVIATION/reading: line 10 literally reads (ε_p − ε_p^q) <= τ (signed), which admits every
#     model worse than H^p however bad and rejects only much better ones; the text says "if the
#     difference between ε_p and ε_p^q is less than τ … assuming that these two participants
#     have a similar data distribution", i.e. the absolute difference — the default here.
#     rule="signed" gives the literal line. τ is not given in the thesis: BOPPID_TAU = 0.1.
#  5. λ_q = n^q / Σ_{s∈S} n^s, σ_p^p = λ_p / λ_max² · ⌈λ_max² / λ_min⌉, σ_q^p = 1 for q != p
#     (lines 14–23); the ceiling is computed exactly in integers (λ_max²/λ_min = n_max² /
#     (n_min Σ_S n)), so a float rounding cannot push an integer ratio up by one. `boppid_coefficients`
#  6. H_p(x) = Σ_{q∈S} Σ_t σ_q^p λ_q α^{q(t)} h^{q(t)}(x) (Output line): site p's own model, one
#     Stumps with every selected stump's α scaled.                      `boppid_combine`, `boppid_score`
# Every site ends with ITS OWN integrated model (BOPPID is personalized by construction).
# The local AdaBoost runs its rounds on the site's rows only, so nothing is exchanged per round;
# the per-round secure-sum loop (`fedboost_reference` and the boost_* functions in stumps.py) is a
# different algorithm (exact federated AdaBoost) and is provided for that purpose.

BOPPID_TAU = 0.1


def boppid_local(X: np.ndarray, y: np.ndarray, rounds: int, *, seed: int = 0) -> Stumps:
    """H^p: the site's local AdaBoost of `rounds` stumps on its own rows (Alg. 4 line 2).
    Deterministic: the exact stump search involves no randomness; `seed` is accepted for the
    job's uniform signature and not used."""
    del seed
    return adaboost(X, y, rounds)


def _predict(model: Stumps, X: np.ndarray) -> np.ndarray:
    return (stumps_score(model, X) > 0).astype(np.int8)


def boppid_errors(models: Sequence[Stumps], X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ε_p^q for every received model q (own model included) on this site's rows (Alg. 4 lines 3
    and 9): float64 (M,). Stays at the site."""
    X = _finite_matrix(X)
    y = _as_labels(y, X.shape[0])
    if y.size == 0:
        raise ValueError("no rows to evaluate on")
    return np.array([float(np.mean(_predict(m, X) != y)) for m in models], dtype=np.float64)


def boppid_select(errors: np.ndarray, me: int, tau: float = BOPPID_TAU, rule: str = "abs") -> np.ndarray:
    """S as a bool mask (M,): this site `me` always, and q with |ε_p − ε_p^q| <= τ (rule "abs")
    or (ε_p − ε_p^q) <= τ (rule "signed", Alg. 4 line 10 literally). errors = `boppid_errors`."""
    e = np.asarray(errors, dtype=np.float64)
    if not 0 <= me < e.size:
        raise ValueError(f"me must index errors, got {me} for {e.size} models")
    diff = e[me] - e
    if rule == "abs":
        sel = np.abs(diff) <= tau
    elif rule == "signed":
        sel = diff <= tau
    else:
        raise ValueError(f"rule must be 'abs' or 'signed', got {rule!r}")
    sel[me] = True
    return sel


def boppid_coefficients(n_rows: Sequence[int], selected: np.ndarray, me: int) -> np.ndarray:
    """σ_q^p · λ_q for every model q (0 for q not in S) — Alg. 4 lines 14–23."""
    n = np.asarray(n_rows)
    sel = np.asarray(selected, dtype=bool)
    if n.shape != sel.shape or not sel[me]:
        raise ValueError("one row count per model, and this site must be selected")
    counts = [int(v) for v in n]
    if any(c < 1 for c in counts):
        raise ValueError("row counts must be >= 1")
    idx = [q for q in range(len(counts)) if sel[q]]
    total = sum(counts[q] for q in idx)
    n_max = max(counts[q] for q in idx)
    n_min = min(counts[q] for q in idx)
    ceil_ratio = -(-(n_max * n_max) // (n_min * total))       # ⌈λ_max²/λ_min⌉, exact
    lam = np.zeros(len(counts), dtype=np.float64)
    for q in idx:
        lam[q] = counts[q] / total
    lam_max = n_max / total
    coef = lam.copy()                                         # σ_q^p = 1 for q != p
    coef[me] = lam[me] / (lam_max * lam_max) * ceil_ratio * lam[me]
    return coef


def boppid_combine(models: Sequence[Stumps], coefficients: np.ndarray) -> Stumps:
    """H_p = Σ_q coef_q · H^q as one Stumps (models with coefficient 0 are left out)."""
    coef = np.asarray(coefficients, dtype=np.float64)
    if coef.shape != (len(models),):
        raise ValueError("one coefficient per model")
    parts = [m.scaled(c) for m, c in zip(models, coef) if c != 0 and m.size]
    if not parts:
        return Stumps.empty()
    return Stumps(np.concatenate([m.feature for m in parts]), np.concatenate([m.threshold for m in parts]),
                  np.concatenate([m.polarity for m in parts]), np.concatenate([m.alpha for m in parts]))


def boppid_score(model: Stumps, X: np.ndarray) -> np.ndarray:
    """Centred BOPPID score Σ σλα h(x); > 0 = positive prediction."""
    return stumps_score(model, X)


def boppid_reference(sites: Sequence[tuple[np.ndarray, np.ndarray]], rounds: int, seed: int = 0, *,
                     tau: float = BOPPID_TAU, rule: str = "abs") -> list[Stumps]:
    """BOPPID in one process: sites[p] = (X_train, y_train) of site p; returns every site's own
    integrated model H_p (list, index = site), composed from the same pure steps a job runs."""
    locals_ = [boppid_local(X, y, rounds, seed=seed) for X, y in sites]
    n = [int(np.asarray(y).shape[0]) for _, y in sites]
    out = []
    for p, (X, y) in enumerate(sites):
        errors = boppid_errors(locals_, X, y)
        coef = boppid_coefficients(n, boppid_select(errors, p, tau, rule), p)
        out.append(boppid_combine(locals_, coef))
    return out
