"""Pure linear-model arithmetic: logistic regression from sums over rows, a small MLP."""
