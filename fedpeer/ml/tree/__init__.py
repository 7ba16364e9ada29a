"""Pure CART arithmetic: one exact tree from summed class-count or label-sum histograms, its
scikit-learn arrays, pruning, rules and predictions."""
