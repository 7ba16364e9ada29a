"""Pure clustering steps: k-means / fuzzy c-means, Gaussian-mixture EM, DBSCAN descriptions."""
