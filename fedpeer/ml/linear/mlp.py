"""A small multi-layer perceptron in scikit-learn's `MLPClassifier` layout, for FedAvg:
pure functions on arrays plus one site's local trainer.

Weights are one flat float64 vector (`flatten`): for each layer its (fan_in, fan_out) matrix
(MLPClassifier.coefs_[i], row-major) then its intercepts (intercepts_[i]). Hidden layers use ReLU
(MLPClassifier's default), the output a logistic unit (binary) or a softmax (K >= 3 classes).
`LocalTrainer` trains a real `MLPClassifier` (solver sgd, momentum 0, constant learning rate: no
optimizer state carries between rounds) for `epochs` passes from given weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def layer_sizes(d: int, hidden: tuple[int, ...], groups: int) -> list[int]:
    """[inputs, hidden..., outputs]: 1 output for a binary label, K for K >= 3 classes."""
    return [d, *hidden, 1 if groups == 1 else groups]


def parse_hidden(text: str) -> tuple[int, ...]:
    """'16' or '32,16' -> (32, 16); ValueError otherwise."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"hidden_layer_sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(not 1 <= s <= 4096 for s in sizes) or len(sizes) > 8:
        raise ValueError(f"hidden_layer_sizes: 1 to 8 layers of 1 to 4096 units, got {text!r}")
    return sizes


def n_weights(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def initial_weights(sizes: list[int], seed: int) -> np.ndarray:
    """Glorot-uniform weights as MLPClassifier draws them (ReLU: bound sqrt(6 / (fan_in + fan_out))),
    from `seed`: every member draws the same."""
    rng = np.random.default_rng(seed)
    parts = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        bound = np.sqrt(6.0 / (a + b))
        parts += [rng.uniform(-bound, bound, (a, b)).ravel(), rng.uniform(-bound, bound, b)]
    return np.concatenate(parts)


def unflatten(w: np.ndarray, sizes: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(coefs_, intercepts_) views of the flat vector."""
    if w.shape != (n_weights(sizes),):
        raise ValueError(f"expected {n_weights(sizes)} weights, got shape {w.shape}")
    coefs, intercepts, at = [], [], 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        coefs.append(w[at:at + a * b].reshape(a, b))
        at += a * b
        intercepts.append(w[at:at + b])
        at += b
    return coefs, intercepts


def flatten(coefs: list[np.ndarray], intercepts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([p for c, b in zip(coefs, intercepts) for p in (c.ravel(), b)])


def predict_proba(coefs: list[np.ndarray], intercepts: list[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Binary: P(positive) (rows,); K classes: (rows, K) — MLPClassifier.predict_proba's values."""
    a = X
    for i, (c, b) in enumerate(zip(coefs, intercepts)):
        a = a @ c + b
        if i < len(coefs) - 1:
            a = np.maximum(a, 0.0)
    if a.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-np.clip(a[:, 0], -500, 500)))
    a = a - a.max(axis=1, keepdims=True)
    e = np.exp(a)
    return e / e.sum(axis=1, keepdims=True)


class LocalTrainer:
    """One site's MLPClassifier, trained `epochs` passes over its rows from the weights it is given
    (shuffled with the site's own seed)."""

    def __init__(self, Z: np.ndarray, y: np.ndarray, sizes: list[int], groups: int, learning_rate: float,
                 batch_size: int, alpha: float, seed: int) -> None:
        from sklearn.neural_network import MLPClassifier

        self.Z, self.y, self.sizes = Z, y, sizes
        self.model: Any = MLPClassifier(hidden_layer_sizes=tuple(sizes[1:-1]), solver="sgd", momentum=0.0,
                                        nesterovs_momentum=False, learning_rate="constant",
                                        learning_rate_init=learning_rate, batch_size=batch_size, alpha=alpha,
                                        shuffle=True, random_state=seed)
        self.classes = np.arange(max(groups, 2))
        self.started = False

    def train(self, w: np.ndarray, epochs: int) -> np.ndarray:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # sklearn's convergence chatter; divergence is checked by the caller
            if not self.started:    # builds the network (one pass, thrown away: the weights are replaced)
                self.model.partial_fit(self.Z, self.y, classes=self.classes)
                self.started = True
            coefs, intercepts = unflatten(w, self.sizes)
            for mine, given in zip(self.model.coefs_ + self.model.intercepts_, coefs + intercepts):
                mine[...] = given       # in place: the optimizer holds these arrays
            for _ in range(epochs):
                self.model.partial_fit(self.Z, self.y)
        return flatten(self.model.coefs_, self.model.intercepts_)
