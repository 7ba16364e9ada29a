"""Pure forest arithmetic: trees as validated arrays, their evaluator, BOFRF, AdaBoost stumps,
BOPPID."""
