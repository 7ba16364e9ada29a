"""L2 logistic regression from sums over rows: pure numpy functions, no I/O.

The log-likelihood, its gradient and its Hessian are sums over rows, so a site computes its own
part (`local_terms`), the parts are added (by the secure sum in fedpeer/kinds/linear/logreg.py, by a plain
sum in `fit_in_process`), and every member derives the same step from the same totals
(`advance`). The model is then exactly the one the pooled rows give.

Problem (scikit-learn's `LogisticRegression(C=C)` on standardised features):
    minimise  F(W) = ( Σ_i loss_i(W) + ||coef||² / (2 C) ) / n
with loss_i the binary (sigmoid) or multinomial (softmax) log-loss of row i, coef = W without
its intercept column (the intercept is not penalised), n the federation's row count. Features
are standardised with the federation's mean and population standard deviation (ddof 0, as
scikit-learn's StandardScaler; a constant column keeps scale 1). W is (groups, d + 1), the last
column the intercept; groups = 1 for a binary label, K >= 3 for a multinomial one. The softmax
intercepts are defined up to a common constant: they are kept summing to zero (as scikit-learn's
newton-cholesky solver ends).

Solvers (a state machine: `start` -> `point` -> (sum) -> `advance` -> `point` ...):
* newton: Newton steps on the summed gradient and Hessian (upper triangle summed), with Armijo
  backtracking; only for P = groups * (d + 1) <= NEWTON_COEFS_MAX.
* lbfgs: L-BFGS (LBFGS_MEMORY pairs) with Armijo backtracking, from the summed gradient only.
Each evaluation (one sum) is at a candidate point; a rejected candidate halves the step.
Stops when max |∇F| <= tol ("converged"), after max_iter accepted steps ("max_iter"), or when
BACKTRACK_MAX halvings cannot lower F at float precision ("stalled": F cannot be improved
further in float64; the gradient left is reported).

Every candidate is rounded to a multiple of 2^-GRID_BITS, so members on machines whose linear
algebra differs in the last bits still evaluate bit-identical points (unless a value lands
within an ulp of a grid midpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

NEWTON_COEFS_MAX = 501      # coefficients (groups * (d + 1)) for which newton sums a Hessian:
                            # 125,751 upper-triangle entries, 3 uint64 limbs each = 2.9 MiB per sum
LBFGS_MEMORY = 10           # (s, y) pairs L-BFGS keeps
ARMIJO = 1e-4               # sufficient-decrease constant of the line search
BACKTRACK_MAX = 40          # step halvings before the line search gives up ("stalled")
GRID_BITS = 40              # candidates are multiples of 2^-40
CHUNK_ROWS = 1 << 15        # rows per block in local_terms (bounds temporary memory)
SLACK = 1e-13               # relative float tolerance of the sufficient-decrease test


class NonFinite(ValueError):
    """A sum or a step that is not finite (a diverging fit, or extreme feature values)."""


@dataclass(frozen=True)
class Problem:
    d: int                 # features
    groups: int            # 1: binary; K >= 3: multinomial
    C: float               # inverse regularisation strength (scikit-learn's C)

    @property
    def coefs(self) -> int:
        return self.groups * (self.d + 1)

    def terms_size(self, hessian: bool) -> int:
        """Length of `local_terms`: [loss, gradient (P), Hessian upper triangle (P(P+1)/2)]."""
        p = self.coefs
        return 1 + p + (p * (p + 1) // 2 if hessian else 0)


# ---------------------------------------------------------------------------------------------
# Standardisation

def moment_sums(X: np.ndarray) -> np.ndarray:
    """Σx per column (float): with the row count, the federation's mean."""
    return X.sum(axis=0)


def centred_sums(X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Σ(x - mean)² per column: the federation's variance without Σx² - n·mean² cancellation."""
    return ((X - mean) ** 2).sum(axis=0)


def scale_from(centred: np.ndarray, n: int) -> np.ndarray:
    """Population standard deviation (ddof 0, StandardScaler's), 1 where it is 0."""
    std = np.sqrt(np.maximum(centred, 0.0) / n)
    return np.where(std > 0, std, 1.0)


def design(X: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(rows, d + 1): standardised features and a column of ones (the intercept's)."""
    Z = np.empty((X.shape[0], X.shape[1] + 1))
    Z[:, :-1] = (X - mean) / scale
    Z[:, -1] = 1.0
    return Z


# ---------------------------------------------------------------------------------------------
# One site's terms

def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def probabilities(Z: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Binary: P(positive) (rows,); multinomial: (rows, K) softmax."""
    if W.shape[0] == 1:
        return np.exp(_log_sigmoid(Z @ W[0]))
    logits = Z @ W.T
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def local_terms(Z: np.ndarray, y: np.ndarray, W: np.ndarray, hessian: bool) -> np.ndarray:
    """[Σ loss_i, Σ ∇loss_i (P, row-major as W), Σ ∇²loss_i upper triangle (row-major)] over this
    site's rows, at W (groups, d + 1). y: 0/1 (binary) or class indices (multinomial)."""
    groups, width = W.shape
    P = groups * width
    loss, grad = 0.0, np.zeros(P)
    H = np.zeros((P, P)) if hessian else None
    for lo in range(0, Z.shape[0], CHUNK_ROWS):
        z, t = Z[lo:lo + CHUNK_ROWS], y[lo:lo + CHUNK_ROWS]
        if groups == 1:
            m = z @ W[0]
            loss += float((np.logaddexp(0.0, m) - t * m).sum())
            p = np.exp(_log_sigmoid(m))
            grad += z.T @ (p - t)
            if H is not None:
                H += (z * (p * (1.0 - p))[:, None]).T @ z
            continue
        logits = z @ W.T
        top = logits.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        loss += float((lse - logits[np.arange(len(t)), t]).sum())
        p = np.exp(logits - lse[:, None])
        r = p.copy()
        r[np.arange(len(t)), t] -= 1.0
        grad += (r.T @ z).ravel()
        if H is not None:
            for k in range(groups):
                for j in range(k, groups):
                    w = p[:, k] * ((1.0 if j == k else 0.0) - p[:, j])
                    block = (z * w[:, None]).T @ z
                    H[k * width:(k + 1) * width, j * width:(j + 1) * width] += block
    out = [np.array([loss]), grad]
    if H is not None:     # (multinomial: only the blocks on and above the diagonal were filled)
        out.append(H[np.triu_indices(P)])
    return np.concatenate(out)


# ---------------------------------------------------------------------------------------------
# The federation's objective from the summed terms

def _penalised(problem: Problem) -> np.ndarray:
    """1 for coefficients, 0 for intercepts (flattened as W)."""
    mask = np.ones((problem.groups, problem.d + 1))
    mask[:, -1] = 0.0
    return mask.ravel()


PLAUSIBLE_SLACK = 1e-6      # relative slack of the bounds below: fixed point and float rounding


def check_terms(problem: Problem, totals: np.ndarray, n: int, hessian: bool) -> None:
    """ValueError unless summed `local_terms` over n rows of standardised columns (every column's
    Σz² <= n; the intercept's is n) are what honest members can give: the log-loss sum >= 0, every
    gradient entry within n (|Σ z (p - t)| <= Σ|z| <= n), every Hessian diagonal entry within
    [0, n/4] (p(1 - p) <= 1/4)."""
    P = problem.coefs
    bound = n * (1 + PLAUSIBLE_SLACK) + 1e-6
    if not np.isfinite(totals).all():
        raise ValueError("every summed term is finite")
    if totals[0] < -1e-6:
        raise ValueError("the summed log-loss is not negative")
    if (np.abs(totals[1:1 + P]) > bound).any():
        raise ValueError("every summed gradient entry is within the rows")
    if hessian:
        upper = np.zeros((P, P))
        upper[np.triu_indices(P)] = totals[1 + P:]
        diag = np.diag(upper)
        if (diag < -1e-6).any() or (diag > bound / 4).any():
            raise ValueError("every summed Hessian diagonal entry is between 0 and rows/4")


def objective(problem: Problem, totals: np.ndarray, W: np.ndarray, n: int,
              hessian: bool) -> tuple[float, float, np.ndarray, np.ndarray | None]:
    """(F, mean log-loss, ∇F, ∇²F or None) at W from the summed `local_terms`; NonFinite if any is
    not finite."""
    P = problem.coefs
    if totals.shape != (problem.terms_size(hessian),):
        raise ValueError(f"expected {problem.terms_size(hessian)} summed terms, got shape {totals.shape}")
    w, mask = W.ravel(), _penalised(problem)
    loss = float(totals[0])
    f = (loss + 0.5 * float((mask * w * w).sum()) / problem.C) / n
    g = (totals[1:1 + P] + mask * w / problem.C) / n
    H = None
    if hessian:
        H = np.zeros((P, P))
        H[np.triu_indices(P)] = totals[1 + P:]
        H = H + np.triu(H, 1).T
        H = H / n + np.diag(mask) / (problem.C * n)
    if not (math.isfinite(f) and np.isfinite(g).all() and (H is None or np.isfinite(H).all())):
        raise NonFinite("the objective or its gradient is not finite")
    return f, loss / n, g, H


# ---------------------------------------------------------------------------------------------
# The solver's state machine

@dataclass(frozen=True)
class Fit:
    problem: Problem
    solver: str                         # "newton" | "lbfgs"
    tol: float
    max_iter: int
    n: int
    candidate: np.ndarray               # (groups, d + 1): where the next sum evaluates
    W: np.ndarray | None = None         # the accepted point (None before the first evaluation)
    f: float = math.nan
    g: np.ndarray | None = None
    direction: np.ndarray | None = None
    step: float = 1.0
    halvings: int = 0
    iterations: int = 0
    evaluations: int = 0
    status: str = "running"             # running | converged | max_iter | stalled
    memory: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    history: tuple[dict, ...] = field(default=())

    @property
    def done(self) -> bool:
        return self.status != "running"

    @property
    def hessian(self) -> bool:
        return self.solver == "newton"


def choose_solver(problem: Problem, solver: str) -> str:
    """'auto' -> newton when the Hessian is small enough, else lbfgs; ValueError for an
    impossible choice."""
    if solver == "auto":
        return "newton" if problem.coefs <= NEWTON_COEFS_MAX else "lbfgs"
    if solver == "newton" and problem.coefs > NEWTON_COEFS_MAX:
        raise ValueError(f"solver newton sums a Hessian of {problem.coefs}² entries; it is limited to "
                         f"{NEWTON_COEFS_MAX} coefficients (classes x (features + 1)): use solver lbfgs")
    if solver not in ("newton", "lbfgs"):
        raise ValueError(f"unknown solver {solver!r}")
    return solver


def start(problem: Problem, solver: str, tol: float, max_iter: int, n: int) -> Fit:
    return Fit(problem, choose_solver(problem, solver), tol, max_iter, n,
               candidate=np.zeros((problem.groups, problem.d + 1)))


def _grid(W: np.ndarray) -> np.ndarray:
    return np.ldexp(np.rint(np.ldexp(W, GRID_BITS)), -GRID_BITS)


def _centre(W: np.ndarray) -> np.ndarray:
    """Softmax intercepts summing to zero (the loss does not change)."""
    if W.shape[0] > 1:
        W = W.copy()
        W[:, -1] -= W[:, -1].mean()
    return W


def _direction(fit: Fit, g: np.ndarray, H: np.ndarray | None) -> np.ndarray:
    problem = fit.problem
    if fit.solver == "newton":
        assert H is not None
        if problem.groups > 1:      # the intercepts' common shift: a null direction of H
            e = 1.0 - _penalised(problem)
            H = H + np.outer(e, e)
        return -np.linalg.solve(H, g)
    q = g.copy()
    alphas = []
    for s, y in reversed(fit.memory):
        a = float(s @ q) / float(y @ s)
        alphas.append(a)
        q -= a * y
    if fit.memory:
        s, y = fit.memory[-1]
        q *= float(s @ y) / float(y @ y)
    else:
        q *= min(1.0, 1.0 / max(float(np.abs(g).max()), 1e-300))
    for (s, y), a in zip(fit.memory, reversed(alphas)):
        b = float(y @ q) / float(y @ s)
        q += (a - b) * s
    return -q


def advance(fit: Fit, totals: np.ndarray) -> Fit:
    """The next state from the summed `local_terms` at `fit.candidate`."""
    W = fit.candidate
    f, loss, g, H = objective(fit.problem, totals, W, fit.n, fit.hessian)
    fit = replace(fit, evaluations=fit.evaluations + 1)
    if fit.W is not None:
        assert fit.g is not None and fit.direction is not None
        slope = float(fit.g @ fit.direction)
        if f > fit.f + ARMIJO * fit.step * slope + SLACK * max(1.0, abs(fit.f)):
            if fit.halvings >= BACKTRACK_MAX:
                return replace(fit, status="stalled")
            step = fit.step / 2
            return replace(fit, step=step, halvings=fit.halvings + 1,
                           candidate=_grid(_centre(fit.W + step * fit.direction.reshape(W.shape))))
        memory = fit.memory
        if fit.solver == "lbfgs":
            s, y = (W - fit.W).ravel(), g - fit.g
            if float(s @ y) > 1e-12 * float(np.linalg.norm(s) * np.linalg.norm(y)):
                memory = (memory + ((s, y),))[-LBFGS_MEMORY:]
        fit = replace(fit, memory=memory, iterations=fit.iterations + 1)
    grad_max = float(np.abs(g).max())
    entry = {"iteration": fit.iterations, "loss": loss, "objective": f, "grad_max": grad_max,
             "step": fit.step if fit.W is not None else 0.0}
    fit = replace(fit, W=W, f=f, g=g, history=fit.history + (entry,))
    if grad_max <= fit.tol:
        return replace(fit, status="converged")
    if fit.iterations >= fit.max_iter:
        return replace(fit, status="max_iter")
    direction = _direction(fit, g, H)
    if not np.isfinite(direction).all():
        raise NonFinite("the step is not finite")
    if float(g @ direction) >= 0:          # not a descent direction (numerically): steepest descent
        direction = -g
    return replace(fit, direction=direction, step=1.0, halvings=0,
                   candidate=_grid(_centre(W + direction.reshape(W.shape))))


# ---------------------------------------------------------------------------------------------
# The model

def unstandardise(W: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coef, intercept) in the original feature units: W·((x - mean)/scale) + b."""
    coef = W[:, :-1] / scale
    return coef, W[:, -1] - coef @ mean


def predict_proba(coef: np.ndarray, intercept: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Binary (1 coefficient row): P(positive) (rows,); multinomial: (rows, K)."""
    logits = X @ coef.T + intercept
    if coef.shape[0] == 1:
        return np.exp(_log_sigmoid(logits[:, 0]))
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def fit_in_process(parts: list[tuple[np.ndarray, np.ndarray]], groups: int, C: float, solver: str = "auto",
                   tol: float = 1e-8, max_iter: int = 100,
                   add: Callable[[list[np.ndarray]], np.ndarray] | None = None,
                   add_columns: Callable[[list[np.ndarray]], np.ndarray] | None = None,
                   ) -> tuple[Fit, np.ndarray, np.ndarray]:
    """The reference: the same functions on the sites' rows in one process, the terms added by
    `add` and the column sums by `add_columns` (each: a list of per-site vectors -> their total;
    default a plain float sum). Returns (final Fit, mean, scale)."""
    def plain(vectors: list[np.ndarray]) -> np.ndarray:
        return np.sum(vectors, axis=0)

    total = add or plain
    columns = add_columns or total
    d = parts[0][0].shape[1]
    n = sum(len(y) for _, y in parts)
    mean = columns([moment_sums(X) for X, _ in parts]) / n
    scale = scale_from(columns([centred_sums(X, mean) for X, _ in parts]), n)
    Zs = [design(X, mean, scale) for X, _ in parts]
    fit = start(Problem(d, groups, C), solver, tol, max_iter, n)
    while not fit.done:
        fit = advance(fit, total([local_terms(Z, y, fit.candidate, fit.hessian) for Z, (_, y) in zip(Zs, parts)]))
    return fit, mean, scale


def sklearn_export(coef: np.ndarray, intercept: np.ndarray, names: list[str], features: list[str]) -> dict:
    """The attributes a scikit-learn LogisticRegression needs to predict (`to_sklearn`): binary
    models' classes are [0, 1] (1 = the positive class) unless the job named two classes."""
    return {"coef_": coef.tolist(), "intercept_": intercept.tolist(),
            "classes_": names if names else [0, 1], "n_features_in_": len(features),
            "feature_names_in_": features}
