"""Pure XGBoost arithmetic: histograms, cut points, exact trees from summed histograms, bagging
rounds, model documents."""
